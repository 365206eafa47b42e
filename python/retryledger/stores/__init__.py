"""Stores for fleet protection: registers with compare-and-set.

A store holds documents only (breaker and retry budget snapshots as JSON
objects); the core computes every transition. Each key is a register:

* ``get(key)`` -> ``(document | None, generation)``: generation 0 when the
  key holds nothing;
* ``compare_and_set(key, expected_generation, document)`` ->
  ``(ok, generation)``: the write happens only when the key's generation is
  ``expected_generation`` (the new generation is one more); otherwise nothing
  changes and the current generation comes back.

The generation is the store's own version counter, not the document's
``generation`` field. A backend that cannot be reached (or fails) raises
:class:`StoreUnavailableError`; the run's policy then decides
(``fail_closed`` / ``fail_open``). The conformance scenarios every backend
passes are ``tests/stores/register.json``.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, Optional, Protocol, Tuple

__all__ = [
    "Store",
    "StoreUnavailableError",
    "MemoryStore",
    "SQLiteStore",
    "RedisStore",
]


class StoreUnavailableError(Exception):
    """The store could not be read or written (unreachable, timed out, failing)."""


class Store(Protocol):
    """A register store (see the module's documentation)."""

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]: ...

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]: ...

    # Optional: get_many(keys) -> [(document | None, generation), ...], several keys at once.


class MemoryStore:
    """A store in this process's memory (thread-safe): for tests, benches and a
    single process's runs."""

    __slots__ = ("_data", "_lock")

    def __init__(self) -> None:
        self._data: Dict[str, Tuple[int, str]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        with self._lock:
            hit = self._data.get(key)
        if hit is None:
            return None, 0
        return _decode(hit[1]), hit[0]

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        text = _encode(document)
        with self._lock:
            hit = self._data.get(key)
            current = 0 if hit is None else hit[0]
            if current != expected_generation:
                return False, current
            self._data[key] = (current + 1, text)
            return True, current + 1


def _encode(document: Dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _decode(text: str) -> Dict[str, Any]:
    value: Dict[str, Any] = json.loads(text)
    return value


from .sqlite import SQLiteStore  # noqa: E402
from .redis import RedisStore  # noqa: E402
