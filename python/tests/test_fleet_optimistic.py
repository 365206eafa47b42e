"""The optimistic admission: the view built from the fleet's cache, the
session's answer previewed under it (``admit_preview``), and one multi-key
check-and-set that checks every key of the view and writes what changed.

Round trips are counted through the Redis client of the round-trips tests
(each command, and each pipeline as one). In the steady state an attempt
costs one round trip to admit and one to record; a stale cache is caught by
the check and the admission made again from the script's answer, with no
separate read."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import retryledger
from retryledger._api import to_text
from retryledger.fleet import Fleet, fresh_breaker
from retryledger.stores import MemoryStore, RedisStore, Row

from conftest import KEY, FakeClock
from fleet_support import BREAKER, fleet_policy, make_store, namespace, redis_url
from test_fleet_roundtrips import counting_fleet, one_run

EPOCH = 1_780_000_000_000
SCOPE = "tenant-7/optimistic"
BUDGET: Dict[str, Any] = {"scope": SCOPE, "ratio_permille": 500, "floor_per_second": 1, "max_tokens": 1000}
BACKENDS = ["memory", "sqlite", "redis", "postgres"]


def primary_down(step: retryledger.Step) -> str:
    if step.route_id == "private-primary":
        raise retryledger.AttemptError.retryable("unavailable")
    return "ok"


def run_down(policy: retryledger.Policy, fleet: Fleet, epoch: int) -> None:
    clock = FakeClock()
    try:
        retryledger.run(
            policy, primary_down, KEY, fleet=fleet, clock=clock, sleep=clock.sleep, wall_clock=lambda: epoch + clock.now
        )
    except retryledger.RunStoppedError:
        pass


def test_redis_steady_state_one_round_trip_to_admit_and_one_to_record() -> None:
    client, fleet = counting_fleet()
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    one_run(policy, Fleet(RedisStore(client), namespace=namespace()))  # loads the scripts
    # A cold cache on an empty store: the check at generation 0 holds.
    del client.sent[:]
    session = policy.session()
    fleet.admit(session, policy, 0, EPOCH)
    assert client.sent == ["EVALSHA"]
    one_run(policy, fleet)
    session = policy.session()
    del client.sent[:]
    fleet.admit(session, policy, 0, EPOCH + 1)
    assert client.sent == ["EVALSHA"]  # checks both breakers, deposits into the budget
    dispatch = session.next()
    assert isinstance(dispatch, retryledger.Dispatch)
    session.observe(0, 10, None, retryledger.Facts(result="returned"))
    del client.sent[:]
    assert fleet.record(session, policy, EPOCH + 2, dispatch.route_release_sha256) is not None
    assert client.sent == ["EVALSHA"]
    del client.sent[:]
    for i in range(20):
        assert one_run(policy, fleet, EPOCH + 10 + i) == "completed"
    assert client.sent == ["EVALSHA"] * 40
    assert fleet.conflicts == 0
    budget = fleet.budget(SCOPE)
    assert budget is not None and budget["deposits"] == 23  # one per admission, none twice


def test_redis_a_cold_cache_on_a_warm_store_costs_one_check_more() -> None:
    client, fleet = counting_fleet()
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    for i in range(3):
        one_run(policy, fleet, EPOCH + i)
    fresh = Fleet(RedisStore(client), namespace=fleet.namespace)  # another process starting
    del client.sent[:]
    session = policy.session()
    fresh.admit(session, policy, 0, EPOCH + 10)
    assert client.sent == ["EVALSHA", "EVALSHA"]  # refused at generation 0, then from the answer
    assert fresh.conflicts == 1
    budget = fresh.budget(SCOPE)
    assert budget is not None and budget["deposits"] == 4


def test_redis_a_breaker_opened_by_another_process_is_caught_by_the_check() -> None:
    client, fleet = counting_fleet()
    other = Fleet(RedisStore(url=redis_url()), namespace=fleet.namespace)  # another process
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    release = str(policy.document["routes"][0]["route_release_sha256"])
    assert one_run(policy, fleet) == "completed"
    cached = fleet._cache[fleet.breaker_key(release)]
    assert cached[0] is not None and '"closed"' in cached[0]
    # The other process sees the primary fail and opens its breaker.
    run_down(policy, other, EPOCH + 1)
    opened = other.breaker(release)
    assert opened is not None and opened["state"] == "open"
    session = policy.session()
    del client.sent[:]
    fleet.admit(session, policy, 0, EPOCH + 2)
    # The check of the cached (closed) breaker failed and answered the open
    # one; the admission was made again from it, without a read.
    assert client.sent == ["EVALSHA", "EVALSHA"]
    assert fleet.conflicts == 1
    dispatch = session.next()
    assert isinstance(dispatch, retryledger.Dispatch)
    assert dispatch.route_release_sha256 != release  # the open route is skipped
    assert fleet._cache[fleet.breaker_key(release)][1] == other._cache[other.breaker_key(release)][1]


class RecordingStore(MemoryStore):
    """A memory store that keeps every multi-key check-and-set's entries and
    whether it succeeded."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Tuple[bool, List[Tuple[str, int, Any]]]] = []
        self.reads = 0

    def get_many_raw(self, keys: List[str]) -> List[Tuple[Any, int]]:
        self.reads += 1
        return super().get_many_raw(keys)

    def check_and_set_raw(self, entries: List[Tuple[str, int, Any]]) -> Tuple[bool, List[Row]]:
        ok, rows = super().check_and_set_raw(entries)
        self.calls.append((ok, list(entries)))
        return ok, rows


def test_every_key_is_in_the_check_and_set_checks_first_then_the_budget() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    store = RecordingStore()
    fleet = Fleet(store)
    one_run(policy, fleet)
    del store.calls[:]
    store.reads = 0
    one_run(policy, fleet, EPOCH + 1)
    assert store.reads == 0
    (ok, entries), (record_ok, record) = store.calls
    assert ok and record_ok and len(record) == 1
    breakers = [fleet.breaker_key(str(r["route_release_sha256"])) for r in policy.document["routes"]]
    assert [key for key, _, _ in entries] == sorted(set(breakers), key=breakers.index) + [fleet.budget_key(SCOPE)]
    assert [text is None for _, _, text in entries] == [True, True, False]  # both breakers checked, the budget written


def test_a_half_open_probe_and_the_budget_in_one_check_and_set() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    store = RecordingStore()
    fleet = Fleet(store)
    release = str(policy.document["routes"][0]["route_release_sha256"])
    run_down(policy, fleet, EPOCH)
    run_down(policy, fleet, EPOCH)
    opened = fleet.breaker(release)
    assert opened is not None and opened["state"] == "open"
    del store.calls[:]
    assert one_run(policy, fleet, EPOCH + 60_000) == "completed"
    ok, entries = store.calls[0]
    assert ok
    # The other route's breaker checked; then the budget, then the probe.
    assert [(key, text is None) for key, _, text in entries][1:] == [
        (fleet.budget_key(SCOPE), False),
        (fleet.breaker_key(release), False),
    ]
    assert entries[0][2] is None


def test_a_write_applied_before_a_conflict_is_built_on() -> None:
    """The budget's write is applied, the probe's conflicts (another process
    reserved it): the refreshed cache holds the budget written and the
    admission made again deposits on top of it (the bounded double deposit)
    and does not take the probe."""
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    store = RecordingStore()
    fleet = Fleet(store)
    other = Fleet(store)  # another process on the same store, its own cache
    release = str(policy.document["routes"][0]["route_release_sha256"])
    run_down(policy, fleet, EPOCH)
    run_down(policy, fleet, EPOCH)
    one_run(policy, other, EPOCH)  # other's cache is current
    assert other.breaker(release) is not None
    # Make fleet's cache of the primary breaker stale, the budget current:
    # the other process reserves the half-open probe first.
    other_session = policy.session()
    other.admit(other_session, policy, 0, EPOCH + 60_000)
    probing = other.breaker(release)
    assert probing is not None and probing["probes_in_flight"] == 1
    before = fleet.budget(SCOPE)
    assert before is not None
    for key in fleet._keys(fleet._shape(policy)):
        if key != fleet.breaker_key(release):
            fleet._cache[key] = store.get_raw(key)
    del store.calls[:]
    session = policy.session()
    fleet.admit(session, policy, 0, EPOCH + 60_001)
    first, second = store.calls
    assert not first[0] and second[0]
    assert fleet.conflicts == 1
    after = fleet.budget(SCOPE)
    assert after is not None and after["deposits"] == before["deposits"] + 2
    dispatch = session.next()
    assert isinstance(dispatch, retryledger.Dispatch)
    assert dispatch.route_release_sha256 != release  # the probe slot is taken


def test_a_dropped_cache_is_read_again_not_taken_for_lost_state() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    store = RecordingStore()
    fleet = Fleet(store)
    one_run(policy, fleet)
    session = policy.session()
    fleet.admit(session, policy, 0, EPOCH + 1)
    fleet._cache.clear()
    store.reads = 0
    fleet.admit(session, policy, 0, EPOCH + 2)
    assert store.reads == 1
    assert fleet.unavailable == 0


def test_a_conflict_every_time_raises_store_conflict() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))

    class Busy(MemoryStore):
        """Another writer moves a breaker before every check-and-set."""

        def check_and_set_raw(self, entries: List[Tuple[str, int, Any]]) -> Tuple[bool, List[Row]]:
            key = entries[0][0]
            text, generation = self.get_raw(key)
            self.compare_and_set_raw(key, generation, text or to_text(fresh_breaker(release, EPOCH)))
            return super().check_and_set_raw(entries)

    release = str(policy.document["routes"][0]["route_release_sha256"])
    fleet = Fleet(Busy(), max_conflicts=2)
    session = policy.session()
    with pytest.raises(retryledger.RetryledgerError) as info:
        fleet.admit(session, policy, 0, EPOCH)
    assert info.value.code == "store_conflict"
    assert fleet.conflicts == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_runs_on_every_backend_admit_with_one_check_and_set(backend: str, tmp_path: Path) -> None:
    inner: Any = make_store(backend, tmp_path)
    calls: List[int] = []

    class Counted:
        """The backend, counting the entries of each check-and-set."""

        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def check_and_set_raw(self, entries: List[Tuple[str, int, Any]]) -> Tuple[bool, List[Row]]:
            calls.append(len(entries))
            result: Tuple[bool, List[Row]] = inner.check_and_set_raw(entries)
            return result

    store: Any = Counted()
    fleet = Fleet(store, namespace=namespace())
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    one_run(policy, fleet)
    del calls[:]
    for i in range(5):
        assert one_run(policy, fleet, EPOCH + 1 + i) == "completed"
    assert calls == [3, 1] * 5
    budget = fleet.budget(SCOPE)
    assert budget is not None and budget["deposits"] == 6
