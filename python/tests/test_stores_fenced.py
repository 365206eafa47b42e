"""append_fenced: an append in the same transaction as a check of a lease
register's generation, on memory, SQLite, Redis and PostgreSQL; and the takeover
window it closes for a journaled run."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, List

import pytest

import retryledger
from retryledger.journaled import JournalStep, LeaseLostError, journal_log, lease_key, run_journaled
from retryledger.stores import MemoryStore

from conftest import KEY, FakeClock, make_policy
from fleet_support import make_store


@pytest.mark.parametrize("backend", ["memory", "sqlite", "redis", "postgres"])
def test_append_fenced_checks_the_lease_in_the_same_write(backend: str, tmp_path: Path) -> None:
    store: Any = make_store(backend, tmp_path)
    lease, log = f"lease/{uuid.uuid4().hex}", f"journal/{uuid.uuid4().hex}"
    with pytest.raises(ValueError):
        store.append_fenced(log, 0, '{"a":0}', lease, 0)  # a held lease is at generation 1 or more
    assert store.append_fenced(log, 0, '{"a":0}', lease, 1) == (False, "lease_lost", None)  # not held
    assert store.compare_and_set(lease, 0, {"owner": 1}) == (True, 1)
    assert store.append_fenced(log, 0, '{"a":0}', lease, 1).ok
    assert store.append_fenced(log, 1, '{"a":1}', lease, 1).ok
    assert store.append_fenced(log, 1, '{"late":1}', lease, 1) == (False, "seq_taken", '{"a":1}')
    assert store.compare_and_set(lease, 1, {"owner": 2}) == (True, 2)
    # The fenced owner is refused even at a free seq; the new one is not.
    assert store.append_fenced(log, 2, '{"a":2}', lease, 1) == (False, "lease_lost", None)
    assert store.append_fenced(log, 1, '{"a":1}', lease, 1) == (False, "lease_lost", None)  # the lease first
    assert store.append_fenced(log, 2, '{"b":2}', lease, 2).ok
    assert [e.text for e in store.read(log)] == ['{"a":0}', '{"a":1}', '{"b":2}']
    with pytest.raises((TypeError, ValueError)):
        store.append_fenced(log, 3, "[]", lease, 2)
    with pytest.raises((TypeError, ValueError)):
        store.append_fenced(log, 3, "{}", lease, -1)
    close = getattr(store, "close", None)
    if close is not None:
        close()


@pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"])
def test_racing_takeovers_and_fenced_appends_never_interleave(backend: str, tmp_path: Path) -> None:
    """Writers at generation g race takeovers to g + 1: every event a writer
    got in was written while its generation held the lease, so in the log no
    event of a lower generation follows one of a higher."""
    lease, log = f"lease/{uuid.uuid4().hex}", f"journal/{uuid.uuid4().hex}"
    setup: Any = make_store(backend, tmp_path)
    assert setup.compare_and_set(lease, 0, {"g": 1})[0]
    stop = threading.Event()

    def writer() -> None:
        store: Any = make_store(backend, tmp_path)
        seq = 0
        while not stop.is_set():
            _, g = store.get(lease)
            answer = store.append_fenced(log, seq, f'{{"g":{g}}}', lease, g)
            if answer.code == "seq_taken":
                seq += 1
            elif answer.ok:
                seq += 1

    def taker() -> None:
        store: Any = make_store(backend, tmp_path)
        held = 0
        for _ in range(40):
            # Each generation gets an event in before the next takeover (so
            # the race is exercised however fast the machine is), waiting at
            # most a second for one.
            deadline = time.monotonic() + 1.0
            while len(store.read(log)) <= held and time.monotonic() < deadline:
                time.sleep(0.001)
            held = len(store.read(log))
            _, g = store.get(lease)
            store.compare_and_set(lease, g, {"g": g + 1})

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for t in threads:
        t.start()
    take = threading.Thread(target=taker)
    take.start()
    take.join()
    stop.set()
    for t in threads:
        t.join()
    import json

    generations: List[int] = [json.loads(e.text)["g"] for e in setup.read(log)]
    assert len(generations) > 10
    assert generations == sorted(generations)


def test_a_late_owner_cannot_slip_an_event_in_before_the_new_owner_writes() -> None:
    """The new owner has taken the lease but written nothing yet (it is asking
    the receiver): the old owner's next append is refused by the store."""
    policy = retryledger.Policy(make_policy())
    store = MemoryStore()
    clock = FakeClock()
    clock.now = 1_780_000_000_000

    def taken_over(step: JournalStep) -> str:
        _, g = store.get(lease_key("w"))
        assert store.compare_and_set(lease_key("w"), g, {"lease_generation": g + 1})[0]
        return "ok"

    with pytest.raises(LeaseLostError) as info:
        run_journaled(policy, taken_over, KEY, store=store, run_id="w", clock=clock, sleep=clock.sleep)
    assert info.value.evidence is None and info.value.seq == 4
    assert len(store.read(journal_log("w"))) == 4  # nothing after `dispatched`
