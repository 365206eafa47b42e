"""Registers and append logs in PostgreSQL (``psycopg`` 3, ``pip install
retryledger[postgres]``), shared by every process on every machine that
reaches the database: the tables ``retryledger_register`` (key, generation,
document) and ``retryledger_log`` (log, seq, event), created when missing,
the same layout as the npm package's store.

* a compare-and-set is one statement: ``INSERT … ON CONFLICT DO NOTHING``
  from generation 0, ``UPDATE … WHERE generation = expected`` after it; the
  row's lock decides between racing writers, so of two processes that both
  expect generation 0 exactly one writes;
* the multi-key check-and-set is one call of the function
  ``retryledger_check_and_set_v1`` (PL/pgSQL, created with the tables): one
  round trip and one transaction, which first takes a transaction advisory
  lock per key (in one order, absent keys included), so two of them on the
  same keys run one after the other as the Redis script does;
* an append is one ``INSERT … ON CONFLICT (log, seq) DO NOTHING``: the
  primary key refuses a taken number, and the event that holds it is read
  back for the answer;
* events and documents are ``text`` columns: stored byte for byte as given
  (``jsonb`` would reorder keys).

The connection is opened at the first call (autocommit, each statement its
own transaction) and opened again at the call after one fails. A server that
cannot be reached, a broken connection or a statement that fails (over
``statement_timeout_ms``, too) is :class:`StoreUnavailableError`; nothing is
retried behind the caller's back: a write whose answer was lost may have
been made, and the caller's next read says.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import (
    APPENDED,
    LEASE_LOST,
    Appended,
    Entry,
    LogEntry,
    Row,
    StoreUnavailableError,
    _decode,
    _encode,
    check_append,
    check_lease,
    check_log,
    check_seq,
)

if TYPE_CHECKING:  # pragma: no cover
    import psycopg

__all__ = ["PostgresStore", "SCHEMA", "CHECK_AND_SET_FUNCTION"]

#: The tables, created when missing (the same statements as the npm package's).
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS retryledger_register ("
    "key text PRIMARY KEY, generation bigint NOT NULL, document text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS retryledger_log ("
    "log text NOT NULL, seq bigint NOT NULL, event text NOT NULL, PRIMARY KEY (log, seq))",
)

#: The multi-key check-and-set (the same function as the npm package's): for
#: keys[i], expected[i] the generation expected and texts[i] the document to
#: write (NULL checks only). Every check-only key is checked first: one
#: differs, nothing is written. Then the documents are written in order, each
#: only when its generation is the one expected (its generation one more),
#: stopping at the first that is not. All written: one row (true, NULL, NULL,
#: NULL); otherwise a row (false, key, generation, document or NULL) for every
#: key, in order, as they now are.
CHECK_AND_SET_FUNCTION = """
CREATE OR REPLACE FUNCTION retryledger_check_and_set_v1(keys text[], expected bigint[], texts text[])
RETURNS TABLE (r_ok boolean, r_key text, r_generation bigint, r_document text)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
  n integer := coalesce(array_length(keys, 1), 0);
  g bigint;
  done boolean := true;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('retryledger register'), h.h)
    FROM (SELECT DISTINCT hashtext(u.k) AS h FROM unnest(keys) AS u(k) ORDER BY 1) AS h;
  FOR i IN 1..n LOOP
    IF texts[i] IS NULL THEN
      SELECT r.generation INTO g FROM retryledger_register AS r WHERE r.key = keys[i];
      IF coalesce(g, 0) <> expected[i] THEN
        done := false;
        EXIT;
      END IF;
    END IF;
  END LOOP;
  IF done THEN
    FOR i IN 1..n LOOP
      CONTINUE WHEN texts[i] IS NULL;
      IF expected[i] = 0 THEN
        INSERT INTO retryledger_register AS r (key, generation, document) VALUES (keys[i], 1, texts[i])
          ON CONFLICT ON CONSTRAINT retryledger_register_pkey DO NOTHING;
      ELSE
        UPDATE retryledger_register AS r SET generation = r.generation + 1, document = texts[i]
          WHERE r.key = keys[i] AND r.generation = expected[i];
      END IF;
      IF NOT FOUND THEN
        done := false;
        EXIT;
      END IF;
    END LOOP;
  END IF;
  IF done THEN
    RETURN QUERY SELECT true, NULL::text, NULL::bigint, NULL::text;
  ELSE
    RETURN QUERY SELECT false, u.k, coalesce(r.generation, 0::bigint), r.document
      FROM unnest(keys) WITH ORDINALITY AS u(k, i)
      LEFT JOIN retryledger_register AS r ON r.key = u.k
      ORDER BY u.i;
  END IF;
END
$fn$
"""

# Creating the tables and the function is serialized across processes (two
# sessions creating the same table at once collide in the catalog).
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('retryledger schema'))"

_SELECT_MANY = "SELECT key, generation, document FROM retryledger_register WHERE key = ANY(%s)"
_SELECT_GENERATION = "SELECT generation FROM retryledger_register WHERE key = %s"
_CREATE = (
    "INSERT INTO retryledger_register (key, generation, document) VALUES (%s, 1, %s) "
    "ON CONFLICT (key) DO NOTHING"
)
_UPDATE = (
    "UPDATE retryledger_register SET generation = generation + 1, document = %s "
    "WHERE key = %s AND generation = %s"
)
_CHECK_AND_SET = "SELECT * FROM retryledger_check_and_set_v1(%s::text[], %s::bigint[], %s::text[])"
_APPEND = "INSERT INTO retryledger_log (log, seq, event) VALUES (%s, %s, %s) ON CONFLICT (log, seq) DO NOTHING"
_EVENT = "SELECT event FROM retryledger_log WHERE log = %s AND seq = %s"
# The lease row is locked FOR SHARE: a takeover's UPDATE waits for this
# append's commit, and an append after the takeover re-reads the new
# generation and inserts nothing.
_APPEND_FENCED = (
    "WITH lease AS (SELECT 1 FROM retryledger_register WHERE key = %s AND generation = %s FOR SHARE) "
    "INSERT INTO retryledger_log (log, seq, event) SELECT %s, %s, %s FROM lease "
    "ON CONFLICT (log, seq) DO NOTHING"
)
# Why a fenced append wrote nothing: the lease's generation and the event at the seq.
_FENCED_WHY = (
    "SELECT (SELECT generation FROM retryledger_register WHERE key = %s), "
    "(SELECT event FROM retryledger_log WHERE log = %s AND seq = %s)"
)
_READ = "SELECT seq, event FROM retryledger_log WHERE log = %s AND seq >= %s ORDER BY seq"
_LAST = "SELECT max(seq) FROM retryledger_log WHERE log = %s"


class PostgresStore:
    """Registers and append logs in PostgreSQL. ``conninfo`` is a libpq
    connection string or URL (``postgresql://user@host:port/db``; empty: the
    ``PG*`` environment variables). ``connect_timeout`` (seconds) bounds a
    connection attempt, ``statement_timeout_ms`` a statement (a lock wait
    included); ``create=False`` leaves the tables and the function to the
    database's owner."""

    __slots__ = ("_conninfo", "_connect_timeout", "_statement_timeout_ms", "_create", "_conn", "_lock")

    def __init__(
        self,
        conninfo: str = "",
        *,
        connect_timeout: float = 2.0,
        statement_timeout_ms: int = 5000,
        create: bool = True,
    ) -> None:
        import psycopg  # noqa: F401  (a missing client is an ImportError here, not an outage later)

        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._statement_timeout_ms = int(statement_timeout_ms)
        self._create = create
        self._conn: "Optional[psycopg.Connection[Any]]" = None
        self._lock = threading.Lock()

    def _connection(self) -> "psycopg.Connection[Any]":
        """The open connection, or a new one (the tables created when missing). Under the lock."""
        import psycopg

        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._conn = None
        if conn is not None:
            conn.close()
        timeout_ms = max(1, int(self._connect_timeout * 1000))
        conn = psycopg.connect(
            self._conninfo,
            autocommit=True,
            connect_timeout=max(1, int(round(self._connect_timeout))),
            # A connection that stops answering mid-statement fails instead of hanging.
            tcp_user_timeout=max(timeout_ms, self._statement_timeout_ms + timeout_ms),
            options=f"-c statement_timeout={self._statement_timeout_ms}",
        )
        try:
            if self._create:
                with conn.transaction():
                    conn.execute(_SCHEMA_LOCK)
                    for statement in SCHEMA:
                        conn.execute(statement)
                    conn.execute(CHECK_AND_SET_FUNCTION)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _fail(self, e: Exception) -> StoreUnavailableError:
        conn = self._conn
        if conn is not None and (conn.closed or conn.broken):
            self._conn = None
            conn.close()
        return StoreUnavailableError(f"postgres store: {e}".rstrip())

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        text, generation = self.get_raw(key)
        return (None if text is None else _decode(text)), generation

    def get_many(self, keys: List[str]) -> List[Tuple[Optional[Dict[str, Any]], int]]:
        """``get`` of several keys in one statement."""
        return [((None if t is None else _decode(t)), g) for t, g in self.get_many_raw(keys)]

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        return self.compare_and_set_raw(key, expected_generation, _encode(document))

    def get_raw(self, key: str) -> Tuple[Optional[str], int]:
        """``get`` with the document as the JSON text stored."""
        return self.get_many_raw([key])[0]

    def get_many_raw(self, keys: List[str]) -> List[Tuple[Optional[str], int]]:
        """``get_raw`` of several keys in one statement."""
        import psycopg

        try:
            with self._lock:
                rows = self._connection().execute(_SELECT_MANY, (list(keys),)).fetchall()
        except psycopg.Error as e:
            raise self._fail(e) from e
        found = {str(row[0]): (str(row[2]), int(row[1])) for row in rows}
        return [found.get(key, (None, 0)) for key in keys]

    def compare_and_set_raw(self, key: str, expected_generation: int, text: str) -> Tuple[bool, int]:
        """``compare_and_set`` of a document given as JSON text (stored as given):
        one statement; when it writes nothing, one more reads the generation."""
        import psycopg

        expected = int(expected_generation)
        if expected < 0:
            raise ValueError(f"expected_generation must be non-negative, got {expected}")
        try:
            with self._lock:
                conn = self._connection()
                if expected == 0:
                    written = conn.execute(_CREATE, (key, text)).rowcount
                else:
                    written = conn.execute(_UPDATE, (text, key, expected)).rowcount
                if written == 1:
                    return True, expected + 1
                row = conn.execute(_SELECT_GENERATION, (key,)).fetchone()
        except psycopg.Error as e:
            raise self._fail(e) from e
        return False, 0 if row is None else int(row[0])

    def check_and_set_raw(self, entries: List[Entry]) -> Tuple[bool, List[Row]]:
        """The multi-key check-and-set (see :mod:`retryledger.stores`): one call
        of ``retryledger_check_and_set_v1``, one round trip, one transaction."""
        import psycopg

        keys = [key for key, _, _ in entries]
        expected = [int(g) for _, g, _ in entries]
        texts = [text for _, _, text in entries]
        try:
            with self._lock:
                rows = self._connection().execute(_CHECK_AND_SET, (keys, expected, texts)).fetchall()
        except psycopg.Error as e:
            raise self._fail(e) from e
        if rows and rows[0][0]:
            return True, []
        return False, [(None if row[3] is None else str(row[3]), int(row[2])) for row in rows]

    def append(self, log: str, seq: int, text: str) -> Appended:
        """Store the event under ``seq`` when it is free (see
        :class:`retryledger.stores.Log`): one ``INSERT``; when the number is
        taken, one more reads the event that holds it."""
        import psycopg

        check_append(log, seq, text)
        try:
            with self._lock:
                conn = self._connection()
                if conn.execute(_APPEND, (log, seq, text)).rowcount == 1:
                    return APPENDED
                row = conn.execute(_EVENT, (log, seq)).fetchone()
        except psycopg.Error as e:
            raise self._fail(e) from e
        if row is None:  # pragma: no cover - events are never removed
            raise StoreUnavailableError(f"postgres store: seq {seq} of {log!r} refused and not found")
        return Appended(False, "seq_taken", str(row[0]))

    def append_fenced(self, log: str, seq: int, text: str, lease_key: str, lease_generation: int) -> Appended:
        """``append`` only while the register ``lease_key`` is at
        ``lease_generation``: one statement that locks the lease row (``FOR
        SHARE``) and inserts; when nothing was inserted, one more tells a
        taken ``seq`` from a lost lease."""
        import psycopg

        check_append(log, seq, text)
        check_lease(lease_generation)
        try:
            with self._lock:
                conn = self._connection()
                if conn.execute(_APPEND_FENCED, (lease_key, lease_generation, log, seq, text)).rowcount == 1:
                    return APPENDED
                row = conn.execute(_FENCED_WHY, (lease_key, log, seq)).fetchone()
        except psycopg.Error as e:
            raise self._fail(e) from e
        generation, held = (None, None) if row is None else row
        if generation is None or int(generation) != lease_generation or held is None:
            return LEASE_LOST
        return Appended(False, "seq_taken", str(held))

    def read(self, log: str, from_seq: int = 0) -> List[LogEntry]:
        """The events from ``from_seq`` on, in ``seq`` order."""
        import psycopg

        check_log(log)
        check_seq(from_seq, "from_seq")
        try:
            with self._lock:
                rows = self._connection().execute(_READ, (log, from_seq)).fetchall()
        except psycopg.Error as e:
            raise self._fail(e) from e
        return [LogEntry(int(seq), str(event)) for seq, event in rows]

    def last_seq(self, log: str) -> Optional[int]:
        """The highest ``seq`` held (``None``: the log is empty)."""
        import psycopg

        check_log(log)
        try:
            with self._lock:
                row = self._connection().execute(_LAST, (log,)).fetchone()
        except psycopg.Error as e:
            raise self._fail(e) from e
        return None if row is None or row[0] is None else int(row[0])

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def __repr__(self) -> str:
        return "PostgresStore(...)"
