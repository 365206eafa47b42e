"""The drivers with ``fleet=``: each attempt admitted against the fleet's
breakers and retry budget before it is dispatched, each outcome recorded in
its breaker after; fleet stops, stores that fail or conflict, and every
driver (run, run_async, run_stream, run_stream_async)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Tuple

import pytest

import retryledger
from retryledger import AttemptError, RunStoppedError, Step
from retryledger.fleet import Fleet
from retryledger.stores import Entry, MemoryStore, Row, StoreUnavailableError

from conftest import KEY, FakeClock, make_policy
from fleet_support import BREAKER, fleet_policy

EPOCH = 1_780_000_000_000
PRIMARY = "private-primary"
FALLBACK = "external-fallback"
SCOPE = "tenant-7/summaries"
BUDGET: Dict[str, Any] = {"scope": SCOPE, "ratio_permille": 500, "floor_per_second": 1, "max_tokens": 3}


def primary_down(routes: List[str]) -> Any:
    def dispatch(step: Step) -> str:
        routes.append(step.route_id)
        if step.route_id == PRIMARY:
            raise AttemptError.retryable("unavailable")
        return "done"

    return dispatch


def serving(routes: List[str]) -> Any:
    """Every route serves."""

    def dispatch(step: Step) -> str:
        routes.append(step.route_id)
        return "done"

    return dispatch


def drive(policy: retryledger.Policy, fleet: Fleet, dispatch: Any, epoch: int = EPOCH) -> Tuple[str, Dict[str, Any]]:
    """One run on a fake clock (wall clock ``epoch`` + run clock): its terminal and bundle."""
    clock = FakeClock()
    try:
        r = retryledger.run(
            policy, dispatch, KEY, fleet=fleet, clock=clock, sleep=clock.sleep, wall_clock=lambda: epoch + clock.now
        )
        return r.terminal, r.bundle
    except RunStoppedError as e:
        return e.terminal, e.bundle


def verified(bundle: Dict[str, Any]) -> bool:
    return bool(retryledger.verify_bundle(json.dumps(bundle))["kind"] == "verified")


def test_a_breaker_opened_by_one_run_skips_the_route_in_the_next() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    fleet = Fleet(MemoryStore(), namespace="t")
    routes: List[str] = []
    terminal, bundle = drive(policy, fleet, primary_down(routes))
    assert terminal == "completed"
    assert routes == [PRIMARY, PRIMARY, FALLBACK]
    assert all("admission" in a for a in bundle["attempts"]["attempts"])
    assert verified(bundle)
    release = bundle["attempts"]["attempts"][0]["route_release_sha256"]
    snapshot = fleet.breaker(release)
    assert snapshot is not None and snapshot["state"] == "open"

    routes.clear()
    terminal, bundle = drive(policy, fleet, primary_down(routes))
    assert terminal == "completed"
    assert routes == [FALLBACK]  # the open primary was skipped without spending an attempt
    first = bundle["attempts"]["attempts"][0]
    assert [s["route_id"] for s in first["admission"]["skipped"]] == [PRIMARY]
    assert bundle["receipt"]["fleet"]["routes_skipped"] == 1
    assert bundle["fleet_snapshots"]["breakers"]
    assert verified(bundle)


def test_after_open_ms_one_probe_closes_the_breaker() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    fleet = Fleet(MemoryStore())
    routes: List[str] = []
    drive(policy, fleet, primary_down(routes))
    opened = fleet.breaker(_primary_release(policy))
    assert opened is not None and opened["state"] == "open"
    routes.clear()
    # Still open 5 s later: skipped.
    terminal, _ = drive(policy, fleet, serving(routes), EPOCH + 5_000)
    assert routes == [FALLBACK]
    # After open_ms (10 s) the next attempt on the primary is a half-open probe.
    routes.clear()
    terminal, bundle = drive(policy, fleet, serving(routes), EPOCH + 20_000)
    assert (terminal, routes) == ("completed", [PRIMARY])
    assert bundle["attempts"]["attempts"][0]["admission"]["breaker"]["probe"] is True
    assert bundle["receipt"]["fleet"]["probes"] == 1
    assert verified(bundle)
    snapshot = fleet.breaker(_primary_release(policy))
    assert snapshot is not None and snapshot["state"] == "closed"


def _primary_release(policy: retryledger.Policy) -> str:
    return str(policy.document["routes"][0]["route_release_sha256"])


def test_every_route_open_stops_before_any_dispatch() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    fleet = Fleet(MemoryStore())
    routes: List[str] = []

    def all_down(step: Step) -> str:
        routes.append(step.route_id)
        raise AttemptError.retryable("unavailable")

    terminal, _ = drive(policy, fleet, all_down)
    assert terminal == "stop_total_attempts"
    dispatched = len(routes)
    terminal, bundle = drive(policy, fleet, all_down)
    assert terminal == "stop_circuit_open"
    assert len(routes) == dispatched  # nothing dispatched by the second run
    assert bundle["attempts"]["fleet_stop"]["reason"] == "circuit_open"
    assert verified(bundle)


def test_the_retry_budget_stops_a_retry_it_does_not_cover() -> None:
    policy = retryledger.Policy(fleet_policy(budget=BUDGET))
    fleet = Fleet(MemoryStore())
    routes: List[str] = []
    terminal, bundle = drive(policy, fleet, primary_down(routes))
    # The first attempt deposits 500 milli-tokens: not enough for a retry.
    assert terminal == "stop_retry_budget"
    assert routes == [PRIMARY]
    assert bundle["attempts"]["fleet_stop"]["reason"] == "retry_budget"
    budget = fleet.budget(SCOPE)
    assert budget is not None and budget["deposits"] == 1 and budget["withdrawals"] == 0
    assert verified(bundle)
    # A second run deposits again: 1,000 milli-tokens cover one retry.
    routes.clear()
    terminal, bundle = drive(policy, fleet, primary_down(routes))
    assert routes == [PRIMARY, PRIMARY]
    assert terminal == "stop_retry_budget"
    assert bundle["receipt"]["fleet"]["withdrawals"] == 1
    budget = fleet.budget(SCOPE)
    assert budget is not None and budget["deposits"] == 2 and budget["withdrawals"] == 1


def test_a_fleet_policy_without_a_fleet_is_refused_before_dispatch() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    routes: List[str] = []
    with pytest.raises(retryledger.DriftError) as info:
        retryledger.run(policy, primary_down(routes), KEY)
    assert info.value.code == "admission_missing"
    assert routes == []


def test_a_fleet_given_to_a_policy_without_a_fleet_section_is_refused_before_dispatch() -> None:
    # The core's rule, as in TypeScript: such a fleet would admit nothing.
    store = MemoryStore()
    routes: List[str] = []
    with pytest.raises(retryledger.DriftError) as info:
        retryledger.run(make_policy(), serving(routes), KEY, fleet=Fleet(store))
    assert (info.value.code, info.value.path) == ("admission_unexpected", "/fleet")
    with pytest.raises(retryledger.DriftError) as info:
        asyncio.run(retryledger.run_async(make_policy(), serving_async(routes), KEY, fleet=Fleet(store)))
    assert (info.value.code, info.value.path) == ("admission_unexpected", "/fleet")
    assert routes == []
    assert store._data == {}


def serving_async(routes: List[str]) -> Any:
    async def dispatch(step: Step) -> str:
        routes.append(step.route_id)
        return "done"

    return dispatch


class DownStore:
    """A store that cannot be reached."""

    def __init__(self) -> None:
        self.calls = 0

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        self.calls += 1
        raise StoreUnavailableError("connection refused")

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        self.calls += 1
        raise StoreUnavailableError("connection refused")


def test_an_unreachable_store_fails_closed() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET, on_store_unavailable="fail_closed"))
    routes: List[str] = []
    terminal, bundle = drive(policy, Fleet(DownStore()), primary_down(routes))
    assert terminal == "stop_store_unavailable"
    assert routes == []
    assert bundle["attempts"]["fleet_stop"]["reason"] == "store_unavailable"
    assert verified(bundle)


def test_an_unreachable_store_fails_open_and_says_so() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET, on_store_unavailable="fail_open"))
    fleet = Fleet(DownStore())
    routes: List[str] = []
    terminal, bundle = drive(policy, fleet, primary_down(routes))
    assert terminal == "completed"
    assert routes == [PRIMARY, PRIMARY, FALLBACK]
    assert [a["admission"].get("store") for a in bundle["attempts"]["attempts"]] == ["unavailable"] * 3
    assert bundle["receipt"]["fleet"]["admitted_without_store"] == 3
    assert fleet.unavailable >= 3
    assert verified(bundle)


class ConflictingStore(MemoryStore):
    """A memory store whose first ``conflicts`` writes lose to another writer
    that wrote the same transition first (another run's equal document)."""

    def __init__(self, conflicts: int) -> None:
        super().__init__()
        self.left = conflicts

    def compare_and_set_raw(self, key: str, expected_generation: int, text: str) -> Tuple[bool, int]:
        if self.left > 0:
            self.left -= 1
            _, generation = self.get_raw(key)
            super().compare_and_set_raw(key, generation, text)
            return False, generation + 1
        return super().compare_and_set_raw(key, expected_generation, text)

    def check_and_set_raw(self, entries: List[Entry]) -> Tuple[bool, List[Row]]:
        if self.left > 0:
            self.left -= 1
            for key, _, text in entries:
                if text is not None:
                    super().compare_and_set_raw(key, self.get_raw(key)[1], text)
            return False, [self.get_raw(key) for key, _, _ in entries]
        return super().check_and_set_raw(entries)


def test_a_conflict_is_read_again_and_admitted_again() -> None:
    policy = retryledger.Policy(fleet_policy(budget=BUDGET))
    store = ConflictingStore(2)
    fleet = Fleet(store)
    terminal, bundle = drive(policy, fleet, lambda step: "ok")
    assert terminal == "completed"
    assert fleet.conflicts == 2
    budget = fleet.budget(SCOPE)
    # Two other runs' deposits won the first two writes; this run's came third.
    assert budget is not None and budget["deposits"] == 3
    assert verified(bundle)


def test_bounded_conflicts_end_in_store_conflict() -> None:
    policy = retryledger.Policy(fleet_policy(budget=BUDGET))
    fleet = Fleet(ConflictingStore(10**6), max_conflicts=3)
    routes: List[str] = []
    with pytest.raises(retryledger.RunError) as info:
        drive(policy, fleet, primary_down(routes))
    assert info.value.code == "store_conflict"
    assert routes == []  # never a silent admit
    assert fleet.conflicts == 4


def test_run_async_admits_and_records() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    fleet = Fleet(MemoryStore())
    routes: List[str] = []

    async def dispatch(step: Step) -> str:
        return primary_down(routes)(step)  # type: ignore[no-any-return]

    async def one() -> Dict[str, Any]:
        clock = FakeClock()
        r = await retryledger.run_async(
            policy, dispatch, KEY, fleet=fleet, clock=clock, sleep=clock.async_sleep, wall_clock=lambda: EPOCH + clock.now
        )
        return r.bundle

    asyncio.run(one())
    assert routes == [PRIMARY, PRIMARY, FALLBACK]
    routes.clear()
    bundle = asyncio.run(one())
    assert routes == [FALLBACK]
    assert verified(bundle)


def _stream_policy() -> retryledger.Policy:
    contract = {"mode": "buffer", "max_response_bytes": 4096}
    return retryledger.Policy(fleet_policy(breaker=BREAKER, stream=contract))


def test_run_stream_and_run_stream_async_admit_each_attempt() -> None:
    policy = _stream_policy()
    fleet = Fleet(MemoryStore())
    routes: List[str] = []

    def dispatch(step: Any) -> Iterator[str]:
        routes.append(step.route_id)
        if step.route_id == PRIMARY:
            raise AttemptError.retryable("unavailable")
        return iter(["hel", "lo"])

    def one() -> Tuple[str, Dict[str, Any], str]:
        clock = FakeClock()
        run = retryledger.run_stream(
            policy, dispatch, KEY, fleet=fleet, clock=clock, sleep=clock.sleep, wall_clock=lambda: EPOCH + clock.now
        )
        text = "".join(e.text or "" for e in run if e.kind == "delta")
        return run.terminal, run.bundle, text

    terminal, bundle, text = one()
    assert (terminal, text) == ("completed", "hello")
    assert routes[-1] == FALLBACK and routes.count(PRIMARY) == 2
    routes.clear()
    terminal, bundle, text = one()
    assert (terminal, text, routes) == ("completed", "hello", [FALLBACK])
    assert verified(bundle)

    async def adispatch(step: Any) -> AsyncIterator[str]:
        routes.append(step.route_id)

        async def gen() -> AsyncIterator[str]:
            yield "hel"
            yield "lo"

        return gen()

    async def aone() -> Tuple[str, Dict[str, Any], str]:
        clock = FakeClock()
        run = retryledger.run_stream_async(
            policy, adispatch, KEY, fleet=fleet, clock=clock, sleep=clock.async_sleep, wall_clock=lambda: EPOCH + clock.now
        )
        parts = [e.text or "" async for e in run if e.kind == "delta"]
        return run.terminal, run.bundle, "".join(parts)

    routes.clear()
    terminal, bundle, text = asyncio.run(aone())
    assert (terminal, text, routes) == ("completed", "hello", [FALLBACK])
    assert bundle["attempts"]["attempts"][0]["admission"]["skipped"][0]["route_id"] == PRIMARY
    assert verified(bundle)


class PlainStore:
    """A store with only the two register operations (no optional fast paths)."""

    def __init__(self) -> None:
        self.data: Dict[str, Tuple[int, str]] = {}

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        hit = self.data.get(key)
        return (None, 0) if hit is None else (json.loads(hit[1]), hit[0])

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        current = self.data.get(key, (0, ""))[0]
        if current != expected_generation:
            return False, current
        self.data[key] = (current + 1, json.dumps(document))
        return True, current + 1


def test_a_store_with_only_get_and_compare_and_set_serves_a_fleet() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=dict(BUDGET, ratio_permille=1000)))
    store = PlainStore()
    fleet = Fleet(store, namespace="plain")
    routes: List[str] = []
    terminal, _ = drive(policy, fleet, primary_down(routes))
    assert routes[:2] == [PRIMARY, PRIMARY]
    routes.clear()
    terminal, bundle = drive(policy, fleet, primary_down(routes))
    assert (terminal, routes) == ("completed", [FALLBACK])
    assert verified(bundle)
    assert sorted(k.split("/")[1] for k in store.data) == ["breaker", "breaker", "budget"]


def test_a_wait_over_the_cap_under_skip_route_parks_the_route_for_the_next_run() -> None:
    """``retry_after_over_cap: skip_route`` with a fleet: the run that saw a
    wait longer than its cap leaves the route, and the route's breaker
    snapshot parks it until the server's time, so a second run skips it and
    a run after that time dispatches to it again."""
    doc = fleet_policy(breaker={"consecutive_failures": 5, "half_open_probes": 1, "open_ms": 10_000})
    doc["backoff"]["retry_after_over_cap"] = "skip_route"
    policy = retryledger.Policy(doc)
    store = MemoryStore()
    fleet = Fleet(store, namespace="parked")
    routes: List[str] = []

    def asks_for_a_long_wait(step: Step) -> str:
        routes.append(step.route_id)
        if step.route_id == PRIMARY:
            raise AttemptError.retryable("rate_limited", retry_after_ms=30_000)
        return "done"

    terminal, first = drive(policy, fleet, asks_for_a_long_wait)
    assert terminal == "completed" and routes == [PRIMARY, FALLBACK]
    assert verified(first)
    routes.clear()
    terminal, second = drive(policy, fleet, serving(routes), epoch=EPOCH + 1_000)
    assert terminal == "completed" and routes == [FALLBACK]
    assert second["receipt"]["fleet"]["routes_skipped"] == 1
    assert verified(second)
    routes.clear()
    terminal, third = drive(policy, fleet, serving(routes), epoch=EPOCH + 31_000)
    assert terminal == "completed" and routes == [PRIMARY]
    assert verified(third)
