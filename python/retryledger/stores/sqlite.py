"""Registers and append logs in an SQLite file, with the standard library's
sqlite3: safe for several processes (and threads) on one machine. Each
compare-and-set is one ``BEGIN IMMEDIATE`` transaction (the write lock is
taken before the generation is read), an append one ``INSERT`` that the
primary key ``(log, seq)`` refuses when the number is taken; the journal is
WAL and a busy timeout waits for another writer instead of failing at once.

``synchronous`` is SQLite's setting: ``NORMAL`` (the default) loses no
commit when a process dies and may lose the last ones when the machine does
(power, kernel); ``FULL`` syncs every commit, which survives both and costs
one sync per commit (docs/BENCHMARKS.md)."""

from __future__ import annotations

import sqlite3
import threading
import os
from typing import Any, Dict, List, Optional, Tuple, Union

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

__all__ = ["SQLiteStore"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS retryledger_register ("
    "key TEXT PRIMARY KEY NOT NULL, generation INTEGER NOT NULL, document TEXT NOT NULL)"
)
_LOG_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS retryledger_log ("
    "log TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL, PRIMARY KEY (log, seq)) WITHOUT ROWID"
)
_SYNCHRONOUS = ("NORMAL", "FULL")


class SQLiteStore:
    """Registers in the table ``retryledger_register`` and append logs in the
    table ``retryledger_log`` of the SQLite file at ``path`` (created when
    absent). ``busy_timeout_ms`` bounds how long a read or write waits for
    another process's write lock before the store reports itself
    unavailable; ``synchronous`` is ``"NORMAL"`` or ``"FULL"`` (see the
    module's documentation)."""

    __slots__ = ("_path", "_conn", "_lock")

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        busy_timeout_ms: int = 5000,
        synchronous: str = "NORMAL",
    ) -> None:
        self._path = os.fspath(path)
        self._lock = threading.Lock()
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        try:
            conn = sqlite3.connect(
                self._path, timeout=busy_timeout_ms / 1000.0, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            conn.execute(_SCHEMA)
            conn.execute(_LOG_SCHEMA)
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"sqlite store {self._path}: {e}") from e
        self._conn = conn

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        text, generation = self.get_raw(key)
        return (None if text is None else _decode(text)), generation

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        return self.compare_and_set_raw(key, expected_generation, _encode(document))

    def get_raw(self, key: str) -> Tuple[Optional[str], int]:
        """``get`` with the document as the JSON text stored."""
        return self.get_many_raw([key])[0]

    def get_many_raw(self, keys: List[str]) -> List[Tuple[Optional[str], int]]:
        """``get_raw`` of several keys in one statement (one read transaction)."""
        marks = ",".join("?" * len(keys))
        try:
            with self._lock:
                rows = self._conn.execute(
                    f"SELECT key, generation, document FROM retryledger_register WHERE key IN ({marks})", keys
                ).fetchall()
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"sqlite store {self._path}: {e}") from e
        found = {row[0]: (str(row[2]), int(row[1])) for row in rows}
        return [found.get(key, (None, 0)) for key in keys]

    def compare_and_set_raw(self, key: str, expected_generation: int, text: str) -> Tuple[bool, int]:
        """``compare_and_set`` of a document given as JSON text (stored as given):
        one ``BEGIN IMMEDIATE`` transaction."""
        try:
            with self._lock:
                conn = self._conn
                conn.execute("BEGIN IMMEDIATE")
                try:
                    row = conn.execute(
                        "SELECT generation FROM retryledger_register WHERE key = ?", (key,)
                    ).fetchone()
                    current = 0 if row is None else int(row[0])
                    if current != expected_generation:
                        conn.execute("ROLLBACK")
                        return False, current
                    conn.execute(
                        "INSERT INTO retryledger_register (key, generation, document) VALUES (?, ?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET generation = excluded.generation, document = excluded.document",
                        (key, current + 1, text),
                    )
                    conn.execute("COMMIT")
                    return True, current + 1
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"sqlite store {self._path}: {e}") from e

    def check_and_set_raw(self, entries: List[Entry]) -> Tuple[bool, List[Row]]:
        """The multi-key check-and-set (see :mod:`retryledger.stores`): one
        ``BEGIN IMMEDIATE`` transaction (the write lock taken before any
        generation is read)."""
        keys = [key for key, _, _ in entries]
        marks = ",".join("?" * len(keys))
        try:
            with self._lock:
                conn = self._conn
                conn.execute("BEGIN IMMEDIATE")
                try:
                    found = {
                        str(row[0]): (str(row[2]), int(row[1]))
                        for row in conn.execute(
                            f"SELECT key, generation, document FROM retryledger_register WHERE key IN ({marks})",
                            keys,
                        ).fetchall()
                    }
                    rows: List[Row] = [found.get(key, (None, 0)) for key in keys]
                    if any(text is None and row[1] != expected for row, (_, expected, text) in zip(rows, entries)):
                        conn.execute("ROLLBACK")
                        return False, rows
                    for i, (key, expected, text) in enumerate(entries):
                        if text is None:
                            continue
                        if rows[i][1] != expected:
                            conn.execute("COMMIT")
                            return False, rows
                        conn.execute(
                            "INSERT INTO retryledger_register (key, generation, document) VALUES (?, ?, ?) "
                            "ON CONFLICT(key) DO UPDATE SET generation = excluded.generation, "
                            "document = excluded.document",
                            (key, expected + 1, text),
                        )
                        rows[i] = (text, expected + 1)
                    conn.execute("COMMIT")
                    return True, []
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"sqlite store {self._path}: {e}") from e

    def append(self, log: str, seq: int, text: str) -> Appended:
        """Store the event under ``seq`` when it is free (see
        :class:`retryledger.stores.Log`): one ``INSERT``, refused by the
        primary key when the number is taken."""
        check_append(log, seq, text)
        try:
            with self._lock:
                conn = self._conn
                cursor = conn.execute(
                    "INSERT INTO retryledger_log (log, seq, event) VALUES (?, ?, ?) ON CONFLICT (log, seq) DO NOTHING",
                    (log, seq, text),
                )
                if cursor.rowcount == 1:
                    return APPENDED
                row = conn.execute("SELECT event FROM retryledger_log WHERE log = ? AND seq = ?", (log, seq)).fetchone()
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"sqlite store {self._path}: {e}") from e
        if row is None:  # pragma: no cover - events are never removed
            raise StoreUnavailableError(f"sqlite store {self._path}: seq {seq} of {log!r} refused and not found")
        return Appended(False, "seq_taken", str(row[0]))

    def append_fenced(self, log: str, seq: int, text: str, lease_key: str, lease_generation: int) -> Appended:
        """``append`` only while the register ``lease_key`` is at
        ``lease_generation``: one ``BEGIN IMMEDIATE`` transaction that reads
        the lease's generation under the write lock, then inserts."""
        check_append(log, seq, text)
        check_lease(lease_generation)
        try:
            with self._lock:
                conn = self._conn
                conn.execute("BEGIN IMMEDIATE")
                try:
                    row = conn.execute(
                        "SELECT generation FROM retryledger_register WHERE key = ?", (lease_key,)
                    ).fetchone()
                    if (0 if row is None else int(row[0])) != lease_generation:
                        conn.execute("ROLLBACK")
                        return LEASE_LOST
                    cursor = conn.execute(
                        "INSERT INTO retryledger_log (log, seq, event) VALUES (?, ?, ?) ON CONFLICT (log, seq) DO NOTHING",
                        (log, seq, text),
                    )
                    held = None
                    if cursor.rowcount != 1:
                        held = conn.execute(
                            "SELECT event FROM retryledger_log WHERE log = ? AND seq = ?", (log, seq)
                        ).fetchone()
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"sqlite store {self._path}: {e}") from e
        if cursor.rowcount == 1:
            return APPENDED
        if held is None:  # pragma: no cover - events are never removed
            raise StoreUnavailableError(f"sqlite store {self._path}: seq {seq} of {log!r} refused and not found")
        return Appended(False, "seq_taken", str(held[0]))

    def read(self, log: str, from_seq: int = 0) -> List[LogEntry]:
        """The events from ``from_seq`` on, in ``seq`` order."""
        check_log(log)
        check_seq(from_seq, "from_seq")
        try:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT seq, event FROM retryledger_log WHERE log = ? AND seq >= ? ORDER BY seq", (log, from_seq)
                ).fetchall()
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"sqlite store {self._path}: {e}") from e
        return [LogEntry(int(seq), str(event)) for seq, event in rows]

    def last_seq(self, log: str) -> Optional[int]:
        """The highest ``seq`` held (``None``: the log is empty)."""
        check_log(log)
        try:
            with self._lock:
                row = self._conn.execute("SELECT max(seq) FROM retryledger_log WHERE log = ?", (log,)).fetchone()
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"sqlite store {self._path}: {e}") from e
        return None if row is None or row[0] is None else int(row[0])

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"
