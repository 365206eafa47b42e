"""Stores: registers with compare-and-set, and append logs.

Backends: :class:`MemoryStore` (one process), :class:`SQLiteStore` (one file,
many processes on one machine), :class:`RedisStore` and
:class:`PostgresStore` (many machines). docs/STORES.md tells which to take.

A store holds documents only (breaker and retry budget snapshots, journal
events as JSON objects); the core computes every transition. Each key is a register:

* ``get(key)`` -> ``(document | None, generation)``: generation 0 when the
  key holds nothing;
* ``compare_and_set(key, expected_generation, document)`` ->
  ``(ok, generation)``: the write happens only when the key's generation is
  ``expected_generation`` (the new generation is one more); otherwise nothing
  changes and the current generation comes back.

The generation is the store's own version counter, not the document's
``generation`` field: it rises on every write, so a compare-and-set that
succeeds proves the snapshot it expected was current.

A store may also offer the multi-key check-and-set a :class:`Fleet
<retryledger.fleet.Fleet>` uses to admit an attempt in one round trip (and
record its outcome in one more); every store here has it:

* ``check_and_set_raw([(key, expected_generation, text | None), ...])`` ->
  ``(ok, rows)``, atomically: every check-only key (``text`` ``None``) is
  checked first, and when one's generation is not the one expected nothing
  is written; then each ``text`` is written in order, only when its key's
  generation is the one expected (its generation one more), stopping at the
  first key whose generation is not. All written: ``(True, [])``; otherwise
  ``(False, rows)`` with the current ``(text | None, generation)`` of every
  key, in order (the writes made before the one that stopped stay: the
  core's session counts an admission's writes as seen, so a write rolled
  back would read as lost state on the admission that follows).

A store without it (only ``get`` and ``compare_and_set``) still serves a
fleet, with a read before every write. A backend that cannot be reached (or fails) raises
:class:`StoreUnavailableError`; the run's policy then decides
(``fail_closed`` / ``fail_open``). The conformance scenarios every backend
passes are ``tests/stores/register.json``.

Every store here is also an append log (:class:`Log`), what a durable
journal is written to: numbered events under a log's name, each written
once.

* ``append(log, seq, text)`` -> :class:`Appended`: the event (the JSON text
  of an object) is stored under ``seq`` exactly as given, byte for byte
  (a journal's hash chain covers those bytes), when ``seq`` is free:
  ``Appended(True, "appended", None)``; when ``seq`` is taken nothing
  changes and the answer is ``Appended(False, "seq_taken", existing)``
  with the event that holds it, so a refused late event can be kept as
  evidence next to the one that won. A taken ``seq`` is an answer, never
  an exception: only input no store takes (``TypeError`` / ``ValueError``,
  before the store is touched) and a store that cannot be reached
  (:class:`StoreUnavailableError`) raise;
* ``read(log, from_seq=0)`` -> the events whose ``seq`` is at least
  ``from_seq``, as :class:`LogEntry` ``(seq, text)`` in ``seq`` order;
* ``last_seq(log)`` -> the highest ``seq`` held, ``None`` for an empty log;
* ``append_fenced(log, seq, text, lease_key, lease_generation)`` (memory,
  SQLite, PostgreSQL): ``append`` in the same transaction as a check that the
  register ``lease_key`` is at generation ``lease_generation``; when it is
  not, nothing is written and the answer is ``Appended(False, "lease_lost",
  None)``. A journaled run appends this way, so an owner whose lease was
  taken over cannot slip one more event in (docs/JOURNAL.md).

A store does not require the numbers to follow one another: gaps and the
order of the events are the journal's to check. Logs and registers are
apart (a log and a register may share a name). The conformance scenarios
are ``tests/stores/log.json``.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Protocol, Tuple

__all__ = [
    "Store",
    "Log",
    "Entry",
    "Row",
    "Appended",
    "LogEntry",
    "StoreUnavailableError",
    "MemoryStore",
    "SQLiteStore",
    "RedisStore",
    "PostgresStore",
]


class StoreUnavailableError(Exception):
    """The store could not be read or written (unreachable, timed out, failing)."""

    #: The stable code, the same in both packages.
    code = "store_unavailable"


class Store(Protocol):
    """A register store (see the module's documentation)."""

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]: ...

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]: ...

    # Optional, used when present: get_many(keys) -> [(document | None,
    # generation), ...]; and the same over JSON text, which spares a decode
    # and an encode per document: get_many_raw(keys) -> [(text | None,
    # generation), ...] with compare_and_set_raw(key, expected, text); and
    # check_and_set_raw(entries) (see the module's documentation).


class Appended(NamedTuple):
    """``append``'s answer: the event stored (``ok``, code ``appended``), or
    its ``seq`` taken (code ``seq_taken``) with the event that holds it, or
    (``append_fenced`` only) the lease moved (code ``lease_lost``)."""

    ok: bool
    code: str
    existing: Optional[str]


class LogEntry(NamedTuple):
    """One event of a log: its number and its JSON text as appended."""

    seq: int
    text: str


class Log(Protocol):
    """An append log (see the module's documentation)."""

    def append(self, log: str, seq: int, text: str) -> Appended: ...

    def read(self, log: str, from_seq: int = 0) -> List[LogEntry]: ...

    def last_seq(self, log: str) -> Optional[int]: ...


APPENDED = Appended(True, "appended", None)

#: ``append_fenced``'s answer when the lease register moved.
LEASE_LOST = Appended(False, "lease_lost", None)

#: The largest ``seq`` a log takes: the largest integer both packages hold exactly.
MAX_SEQ = 2**53 - 1


def check_append(log: str, seq: int, text: str) -> None:
    """Refuse (``TypeError`` / ``ValueError``) what no store takes: a log name
    that is not a non-empty string, a ``seq`` that is not an integer in
    ``0..MAX_SEQ``, an event that is not the JSON text of an object."""
    check_log(log)
    check_seq(seq, "seq")
    if not isinstance(text, str):
        raise TypeError(f"an event is the JSON text of an object (str), got {type(text).__name__}")
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"an event is the JSON text of an object: {e}") from None
    if not isinstance(value, dict):
        raise ValueError("an event is the JSON text of an object")


def check_lease(lease_generation: int) -> None:
    """A held lease's generation: an integer in ``1..2^53-1`` (a lease is
    claimed by a compare-and-set from 0, so a held one is at least 1)."""
    check_seq(lease_generation, "lease_generation")
    if lease_generation < 1:
        raise ValueError("lease_generation must be at least 1: a lease is held from generation 1")


def check_log(log: str) -> None:
    if not isinstance(log, str) or not log:
        raise TypeError("a log's name is a non-empty string")


def check_seq(seq: int, name: str) -> None:
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError(f"{name} must be an integer, got {type(seq).__name__}")
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"{name} must be in 0..{MAX_SEQ}, got {seq}")


#: One entry of a multi-key check-and-set: the key, the generation expected,
#: and the JSON text to write (``None``: check only).
Entry = Tuple[str, int, Optional[str]]
#: A key's current state in a store: its JSON text (``None``: absent) and generation.
Row = Tuple[Optional[str], int]


class MemoryStore:
    """A store in this process's memory (thread-safe): for tests, benches and a
    single process's runs. Registers and append logs."""

    __slots__ = ("_data", "_logs", "_lock")

    def __init__(self) -> None:
        self._data: Dict[str, Tuple[int, str]] = {}
        self._logs: Dict[str, Dict[int, str]] = {}
        self._lock = threading.Lock()

    def append(self, log: str, seq: int, text: str) -> Appended:
        """Store the event under ``seq`` when it is free (see :class:`Log`)."""
        check_append(log, seq, text)
        with self._lock:
            events = self._logs.setdefault(log, {})
            existing = events.get(seq)
            if existing is not None:
                return Appended(False, "seq_taken", existing)
            events[seq] = text
            return APPENDED

    def append_fenced(self, log: str, seq: int, text: str, lease_key: str, lease_generation: int) -> Appended:
        """``append`` only while the register ``lease_key`` is at ``lease_generation``."""
        check_append(log, seq, text)
        check_lease(lease_generation)
        with self._lock:
            hit = self._data.get(lease_key)
            if (0 if hit is None else hit[0]) != lease_generation:
                return LEASE_LOST
            events = self._logs.setdefault(log, {})
            existing = events.get(seq)
            if existing is not None:
                return Appended(False, "seq_taken", existing)
            events[seq] = text
            return APPENDED

    def read(self, log: str, from_seq: int = 0) -> List[LogEntry]:
        """The events from ``from_seq`` on, in ``seq`` order."""
        check_log(log)
        check_seq(from_seq, "from_seq")
        with self._lock:
            events = dict(self._logs.get(log, {}))
        return [LogEntry(seq, events[seq]) for seq in sorted(events) if seq >= from_seq]

    def last_seq(self, log: str) -> Optional[int]:
        """The highest ``seq`` held (``None``: the log is empty)."""
        check_log(log)
        with self._lock:
            events = self._logs.get(log)
            return max(events) if events else None

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        text, generation = self.get_raw(key)
        return (None if text is None else _decode(text)), generation

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        return self.compare_and_set_raw(key, expected_generation, _encode(document))

    def get_raw(self, key: str) -> Tuple[Optional[str], int]:
        """``get`` with the document as the JSON text stored."""
        hit = self._data.get(key)
        return (None, 0) if hit is None else (hit[1], hit[0])

    def get_many_raw(self, keys: List[str]) -> List[Tuple[Optional[str], int]]:
        """``get_raw`` of several keys."""
        data = self._data
        out: List[Tuple[Optional[str], int]] = []
        for key in keys:
            hit = data.get(key)
            out.append((None, 0) if hit is None else (hit[1], hit[0]))
        return out

    def compare_and_set_raw(self, key: str, expected_generation: int, text: str) -> Tuple[bool, int]:
        """``compare_and_set`` of a document given as JSON text (stored as given)."""
        with self._lock:
            hit = self._data.get(key)
            current = 0 if hit is None else hit[0]
            if current != expected_generation:
                return False, current
            self._data[key] = (current + 1, text)
            return True, current + 1

    def check_and_set_raw(self, entries: List[Entry]) -> Tuple[bool, List[Row]]:
        """The multi-key check-and-set (see the module's documentation), under
        the store's lock."""
        with self._lock:
            data = self._data

            def generation(key: str) -> int:
                hit = data.get(key)
                return 0 if hit is None else hit[0]

            def current() -> List[Row]:
                rows: List[Row] = []
                for key, _, _ in entries:
                    hit = data.get(key)
                    rows.append((None, 0) if hit is None else (hit[1], hit[0]))
                return rows

            for key, expected, text in entries:
                if text is None and generation(key) != expected:
                    return False, current()
            for key, expected, text in entries:
                if text is not None:
                    if generation(key) != expected:
                        return False, current()
                    data[key] = (expected + 1, text)
            return True, []


def _encode(document: Dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _decode(text: str) -> Dict[str, Any]:
    value: Dict[str, Any] = json.loads(text)
    return value


from .sqlite import SQLiteStore  # noqa: E402
from .redis import RedisStore  # noqa: E402
from .postgres import PostgresStore  # noqa: E402
