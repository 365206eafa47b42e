"""Admission limits through the drivers (docs/FLEET.md): each attempt admitted
under a cap on attempts in flight and request / token buckets kept in the
store, queued attempts waiting their planned start (fake clock), a full cap
polled until the queue bound stops the run, the slot released after every
attempt (an answer, an error, a cancellation), on every backend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

import retryledger
from retryledger import AttemptError, RunCancelledError, RunStoppedError, Step
from retryledger.fleet import Fleet

from conftest import KEY, FakeClock, make_policy
from fleet_support import make_store, namespace

EPOCH = 1_780_000_000_000
PRIMARY = "private-primary"


def limits_policy(admission: Dict[str, Any], **overrides: Any) -> Dict[str, Any]:
    return make_policy(fleet={"admission": admission, "on_store_unavailable": "fail_closed"}, **overrides)


def release_of(policy: retryledger.Policy) -> str:
    return str(policy.document["routes"][0]["route_release_sha256"])


def drive(
    policy: retryledger.Policy, fleet: Fleet, dispatch: Any, clock: Optional[FakeClock] = None, epoch: int = EPOCH
) -> Tuple[str, Dict[str, Any], FakeClock]:
    """One run on a fake clock (wall clock ``epoch`` + run clock)."""
    clock = clock or FakeClock()
    start = clock.now
    try:
        r = retryledger.run(
            policy,
            dispatch,
            KEY,
            fleet=fleet,
            clock=clock,
            sleep=clock.sleep,
            wall_clock=lambda: epoch + clock.now - start,
        )
        return r.terminal, r.bundle, clock
    except RunStoppedError as e:
        return e.terminal, e.bundle, clock


def serving(step: Step) -> str:
    return "done"


BACKENDS = ["memory", "sqlite", "redis", "postgres"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_admitted_at_once_then_released(backend: str, tmp_path: Path) -> None:
    policy = retryledger.Policy(limits_policy({"max_in_flight": 2, "max_queue_ms": 1000, "request_burst": 2, "requests_per_second": 10}))
    fleet = Fleet(make_store(backend, tmp_path), namespace=namespace())
    terminal, bundle, _ = drive(policy, fleet, serving)
    assert terminal == "completed"
    limits = bundle["attempts"]["attempts"][0]["admission"]["limits"]
    assert limits["queue_wait_ms"] == 0 and limits["start_epoch_ms"] == EPOCH
    assert bundle["receipt"]["fleet"]["queue_wait_ms"] == 0
    assert retryledger.verify_bundle(bundle)["kind"] == "verified"
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    # Admitted (one request taken from the burst of 2), then released.
    assert (snapshot["in_flight"], snapshot["request_level_milli"]) == (0, 1000)
    assert fleet.releases == 1


def test_a_spent_bucket_queues_the_next_run_for_its_planned_start() -> None:
    """Burst 1, 10 per second: the second run, admitted at the same wall
    clock, waits 100 ms (slept on the fake clock) and records it."""
    policy = retryledger.Policy(limits_policy({"max_queue_ms": 1000, "request_burst": 1, "requests_per_second": 10}))
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    _, first, _ = drive(policy, fleet, serving)
    clock = FakeClock()
    starts: List[int] = []

    def dispatch(step: Step) -> str:
        starts.append(step.started_at_ms)
        return "done"

    terminal, second, _ = drive(policy, fleet, dispatch, clock)
    assert terminal == "completed"
    assert first["attempts"]["attempts"][0]["admission"]["limits"]["queue_wait_ms"] == 0
    limits = second["attempts"]["attempts"][0]["admission"]["limits"]
    assert (limits["queue_wait_ms"], limits["start_epoch_ms"]) == (100, EPOCH + 100)
    assert starts == [100] and clock.sleeps == [100]
    assert second["receipt"]["fleet"]["queue_wait_ms"] == 100
    assert retryledger.verify_bundle(second)["kind"] == "verified"


def test_a_full_cap_polls_then_the_queue_bound_stops_the_run() -> None:
    policy = retryledger.Policy(limits_policy({"max_in_flight": 1, "max_queue_ms": 50}))
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    release = release_of(policy)
    held = {
        "generation": 1, "in_flight": 1, "request_level_milli": 0, "requests_at_epoch_ms": EPOCH,
        "route_release_sha256": release, "schema": "retryledger.admission.v1",
        "token_level_milli": 0, "tokens_at_epoch_ms": EPOCH, "updated_at_epoch_ms": EPOCH,
    }  # fmt: skip
    assert fleet.store.compare_and_set(fleet.admission_key(release), 0, held)[0]
    calls: List[str] = []
    terminal, bundle, clock = drive(policy, fleet, lambda step: calls.append("x"))
    assert terminal == "stop_admission" and calls == []
    # Asked at 0, 20 and 40 ms; the next ask (60 ms) is past the 50 ms bound.
    assert clock.sleeps == [20, 20]
    stop = bundle["attempts"]["fleet_stop"]
    assert (stop["reason"], stop["limits"]["queue_wait_ms"], stop["limits"]["start_epoch_ms"]) == ("admission", 40, EPOCH + 60)
    assert retryledger.verify_bundle(bundle)["kind"] == "verified"


def test_a_queue_that_reaches_the_deadline_stops_before_dispatch() -> None:
    policy = retryledger.Policy(
        limits_policy({"max_queue_ms": 60_000, "request_burst": 1, "requests_per_second": 1}, deadline_ms=500)
    )
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    assert drive(policy, fleet, serving)[0] == "completed"
    terminal, bundle, clock = drive(policy, fleet, serving)
    # The next request is planned 1 s later, past the 500 ms deadline: no sleep.
    assert terminal == "stop_admission" and clock.sleeps == []
    assert bundle["attempts"]["fleet_stop"]["limits"]["start_epoch_ms"] == EPOCH + 1000


def test_errors_release_their_slot_and_tokens_are_reserved() -> None:
    policy = retryledger.Policy(
        limits_policy({"max_in_flight": 1, "max_queue_ms": 1000, "token_bound": 1000, "tokens_per_second": 100})
    )
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace(), reserve_tokens=300)

    def fails(step: Step) -> str:
        raise AttemptError.retryable("unavailable")

    terminal, bundle, _ = drive(policy, fleet, fails)
    assert terminal == "stop_total_attempts"
    attempts = bundle["attempts"]["attempts"]
    assert len(attempts) == 4 and all(a["admission"]["limits"]["tokens"] == 300 for a in attempts)
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None and snapshot["in_flight"] == 0
    assert fleet.releases == 4
    assert retryledger.verify_bundle(bundle)["kind"] == "verified"


def test_a_token_bucket_needs_the_reservation() -> None:
    policy = retryledger.Policy(limits_policy({"max_queue_ms": 1000, "token_bound": 1000, "tokens_per_second": 100}))
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    with pytest.raises(retryledger.RetryledgerError) as e:
        drive(policy, fleet, serving)
    assert e.value.code == "invalid_value"


def test_cancelled_while_queued_releases_the_slot() -> None:
    policy = retryledger.Policy(limits_policy({"max_in_flight": 4, "max_queue_ms": 5000, "request_burst": 1, "requests_per_second": 1}))
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    # The real clocks: this run spends the burst, so the next waits ~1 s.
    assert retryledger.run(policy, serving, KEY, fleet=fleet).terminal == "completed"

    async def go() -> None:
        async def dispatch(step: Step) -> str:
            return "done"

        task = asyncio.ensure_future(retryledger.run_async(policy, dispatch, KEY, fleet=fleet))
        await asyncio.sleep(0.1)  # admitted, waiting ~1 s for its planned start
        held = fleet.admission(policy, release_of(policy))
        assert held is not None and held["in_flight"] == 1
        task.cancel()
        with pytest.raises(RunCancelledError):
            await task

    asyncio.run(go())
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None and snapshot["in_flight"] == 0


@pytest.mark.parametrize(
    ("admission", "path"),
    [
        ({"max_in_flight": 0, "max_queue_ms": 100}, "/fleet/admission/max_in_flight"),
        ({"max_in_flight": 1, "max_queue_ms": 0}, "/fleet/admission/max_queue_ms"),
        ({"max_queue_ms": 100, "tokens_per_second": 10}, "/fleet/admission/token_bound"),
    ],
)
def test_bad_limits_are_coded_before_dispatch(admission: Dict[str, Any], path: str) -> None:
    with pytest.raises(retryledger.RetryledgerError) as e:
        retryledger.Policy(limits_policy(admission))
    assert (e.value.code, e.value.path) == ("invalid_admission", path)


def test_the_pure_transitions() -> None:
    config = {"max_queue_ms": 1000, "request_burst": 1, "requests_per_second": 10}
    release = "ab" * 32
    snapshot = {
        "generation": 0, "in_flight": 0, "request_level_milli": 0, "requests_at_epoch_ms": EPOCH,
        "route_release_sha256": release, "schema": "retryledger.admission.v1",
        "token_level_milli": 0, "tokens_at_epoch_ms": EPOCH, "updated_at_epoch_ms": EPOCH,
    }  # fmt: skip
    step = retryledger.admission_admit(config, snapshot, EPOCH, EPOCH, 0)
    assert step["answer"] == {"kind": "admitted", "start_epoch_ms": EPOCH + 100}
    after = retryledger.admission_release(config, step["snapshot"], EPOCH + 150, 0)
    assert after["in_flight"] == 0 and after["generation"] == 2
    assert json.loads(json.dumps(after)) == after


def test_reported_tokens_settle_the_reservation() -> None:
    policy = retryledger.Policy(limits_policy({"max_queue_ms": 1000, "token_bound": 1000, "tokens_per_second": 100}))
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace(), reserve_tokens=300)

    def dispatch(step: Step) -> str:
        step.tokens_used(60)
        step.tokens_used(40)
        return "done"

    terminal, bundle, _ = drive(policy, fleet, dispatch)
    assert terminal == "completed"
    assert bundle["attempts"]["attempts"][0]["admission"]["limits"]["tokens"] == 300
    snapshot = fleet.admission(policy, release_of(policy))
    # 1,000 - 300 reserved + 200 unused back.
    assert snapshot is not None and (snapshot["in_flight"], snapshot["token_level_milli"]) == (0, 900_000)
