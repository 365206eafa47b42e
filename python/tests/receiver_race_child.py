"""A child process of the receiver race test: one receiver guard over a
PostgreSQL store, driven line by line on stdin, one answer line of JSON on
stdout per command.

    receiver_race_child.py <database url> <register prefix>

Command (the time is ``time.monotonic_ns()``, the same clock in every process
of the machine; the child waits for it, so both racers start together):

    claim <at_ns> <idempotency key> <body>

The child runs the guard's claim path (read the record, the core's claim,
compare-and-set) for ``POST /orders`` with that key and body, and answers
``{"admitted", "status", "code", "first_read_empty", "cas": [ok, ...],
"start", "end"}``; an admitted request is left in progress.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from retryledger.receiver import HttpRequest, IdempotencyGuard
from retryledger.stores import PostgresStore

RETENTION = {"expired": "reject", "poll_after_ms": 1000, "ttl_ms": 600_000}


class Watched:
    """The store, with what the claim read and wrote noted."""

    def __init__(self, inner: PostgresStore) -> None:
        self.inner = inner
        self.reads: List[int] = []
        self.cas: List[bool] = []

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        document, generation = self.inner.get(key)
        self.reads.append(generation)
        return document, generation

    def compare_and_set(self, key: str, expected: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        ok, generation = self.inner.compare_and_set(key, expected, document)
        self.cas.append(ok)
        return ok, generation


def main() -> None:
    store = Watched(PostgresStore(sys.argv[1]))
    guard = IdempotencyGuard(store, RETENTION, prefix=sys.argv[2])
    store.inner.get(f"{sys.argv[2]}warm-up")  # connect before the first round
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command, at, key, body = line.rstrip("\n").split(" ", 3)
        if command != "claim":
            raise SystemExit(f"unknown command {command}")
        store.reads.clear()
        store.cas.clear()
        request = HttpRequest("POST", "/orders", {"idempotency-key": key}, body.encode())
        target = int(at)
        while time.monotonic_ns() < target:
            pass
        start = time.monotonic_ns()
        decision = guard.begin(request)
        end = time.monotonic_ns()
        answer = decision.answer
        print(
            json.dumps(
                {
                    "admitted": decision.admitted is not None,
                    "status": None if answer is None else answer.status,
                    "code": None if answer is None else answer.json()["code"],
                    "first_read_empty": store.reads[:1] == [0],
                    "cas": store.cas,
                    "start": start,
                    "end": end,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
