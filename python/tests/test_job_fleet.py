"""run_job and run_job_async under a fleet section: each submit is admitted
against the fleet's store (its route's breaker, the retry budget) and its
outcome settled there; polls ask about the accepted job and are not
admitted. The same runs against the in-memory store and a SQLite file. A
fleet and a policy that do not fit each other are the core's refusals,
before any request."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, List

import pytest

import retryledger
from retryledger.fleet import Fleet
from retryledger.job import AsyncJobCalls, JobAnswer, JobCalls, run_job, run_job_async
from retryledger.stores import MemoryStore, SQLiteStore

from conftest import KEY, FakeClock, make_policy
from fleet_support import BREAKER, fleet_policy, namespace

EPOCH = 1_780_000_000_000
JOB = {"max_polls": 4, "poll_base_ms": 200, "poll_max_ms": 1_000}
BUDGET = {"floor_per_second": 5, "max_tokens": 5, "ratio_permille": 500, "scope": "jobs"}


def job_fleet_policy(budget: bool = False) -> Dict[str, Any]:
    if budget:
        return fleet_policy(budget=BUDGET, async_job=dict(JOB), deadline_ms=20_000)
    return fleet_policy(breaker=BREAKER, async_job=dict(JOB), deadline_ms=20_000)


class Provider:
    """Job calls on a fake clock: a submit on the primary fails unavailable,
    on the fallback it is accepted; the job is polled once running, then completed."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: List[str] = []
        self.statuses: List[str] = []

    def submit(self, step: retryledger.Step) -> JobAnswer[str]:
        self.sent.append(f"submit:{step.route_id}")
        self.clock.advance(10)
        if step.route_id == "private-primary":
            raise retryledger.AttemptError.retryable("unavailable")
        self.statuses = ["in_progress", "completed"]
        return JobAnswer(status="queued", value="accepted", id=f"job-{len(self.sent)}")

    def poll(self, job_id: str, step: retryledger.Step) -> JobAnswer[str]:
        self.sent.append(f"poll:{job_id}")
        self.clock.advance(10)
        status = self.statuses.pop(0) if self.statuses else "completed"
        return JobAnswer(status=status, value="the answer" if status == "completed" else "running")

    def calls(self) -> JobCalls[str]:
        return JobCalls(submit=self.submit, poll=self.poll)

    def async_calls(self) -> AsyncJobCalls[str]:
        async def submit(step: retryledger.Step) -> JobAnswer[str]:
            return self.submit(step)

        async def poll(job_id: str, step: retryledger.Step) -> JobAnswer[str]:
            return self.poll(job_id, step)

        return AsyncJobCalls(submit=submit, poll=poll)


def verified(bundle_json: str) -> bool:
    return bool(retryledger.verify_bundle(bundle_json)["kind"] == "verified")


def breaker_opens_then_skips(fleet: Fleet) -> None:
    policy = job_fleet_policy()
    clock = FakeClock()
    provider = Provider(clock)
    options: Dict[str, Any] = {
        "fleet": fleet, "clock": clock, "sleep": clock.sleep, "wall_clock": lambda: EPOCH + clock.now
    }
    first = run_job(policy, provider.calls(), KEY, **options)
    assert first.value.value == "the answer"
    assert provider.sent == [
        "submit:private-primary", "submit:private-primary", "submit:external-fallback", "poll:job-3", "poll:job-3"
    ]
    attempts = first.bundle["attempts"]["attempts"]
    # Every submit admitted (its snapshot digest recorded); the polls not.
    assert [(a["job"]["kind"], "admission" in a) for a in attempts] == [
        ("submit", True), ("submit", True), ("submit", True), ("poll", False), ("poll", False)
    ]
    assert verified(first.bundle_json)
    assert "fleet_snapshots" in first.bundle
    # Two failures opened the primary's breaker in the store.
    primary = policy["routes"][0]["route_release_sha256"]
    document, _ = fleet.store.get(f"{fleet.namespace}/breaker/{primary}")
    assert document is not None and document["state"] == "open"

    # The next job skips the open primary without submitting to it.
    provider.sent.clear()
    second = run_job(policy, provider.calls(), KEY, **options)
    assert second.value.value == "the answer"
    assert provider.sent[0] == "submit:external-fallback"
    assert "submit:private-primary" not in provider.sent
    assert second.receipt["fleet"]["routes_skipped"] == 1
    assert second.bundle["attempts"]["attempts"][0]["admission"]["skipped"][0]["route_id"] == "private-primary"
    assert verified(second.bundle_json)


def test_run_job_under_a_fleet_in_memory() -> None:
    breaker_opens_then_skips(Fleet(MemoryStore(), namespace=namespace()))


def test_run_job_under_a_fleet_on_sqlite(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "fleet.sqlite3")
    try:
        breaker_opens_then_skips(Fleet(store, namespace=namespace()))
    finally:
        store.close()


def test_the_retry_budget_stops_a_resubmit_it_does_not_cover() -> None:
    clock = FakeClock()
    provider = Provider(clock)
    fleet = Fleet(MemoryStore(), namespace=namespace())
    with pytest.raises(retryledger.RunStoppedError) as stopped:
        run_job(job_fleet_policy(budget=True), provider.calls(), KEY, fleet=fleet, clock=clock, sleep=clock.sleep,
                wall_clock=lambda: EPOCH + clock.now)
    # The first submit deposited less than a retry withdraws: no second submit.
    assert stopped.value.terminal == "stop_retry_budget"
    assert provider.sent == ["submit:private-primary"]
    budget, _ = fleet.store.get(f"{fleet.namespace}/budget/jobs")
    assert budget is not None
    assert verified(stopped.value.bundle_json)


def test_run_job_async_under_a_fleet_takes_the_hooks_and_the_clock() -> None:
    clock = FakeClock()
    provider = Provider(clock)
    fleet = Fleet(MemoryStore(), namespace=namespace())
    seen: List[str] = []

    def on_attempt(a: Dict[str, Any], j: Any) -> None:
        seen.append(f"{a['job']['kind']}:{a['route_id']}:{j.rule}:{'admission' in a}")

    async def main() -> Any:
        return await run_job_async(
            job_fleet_policy(),
            provider.async_calls(),
            KEY,
            fleet=fleet,
            clock=clock,
            sleep=clock.async_sleep,
            wall_clock=lambda: EPOCH + clock.now,
            on_attempt=on_attempt,
            on_terminal=lambda r: seen.append(f"terminal:{r['terminal']}"),
        )

    run = asyncio.run(main())
    assert run.terminal == "completed"
    assert seen[:3] == [
        "submit:private-primary:explicit:True",
        "submit:private-primary:explicit:True",
        "submit:external-fallback:returned:True",
    ]
    assert seen[-1] == "terminal:completed"
    assert verified(run.bundle_json)


def test_a_fleet_and_a_policy_that_do_not_fit_are_refused_before_any_request() -> None:
    provider = Provider(FakeClock())
    with pytest.raises(retryledger.DriftError) as missing:
        run_job(job_fleet_policy(), provider.calls(), KEY)
    assert (missing.value.code, missing.value.path) == ("admission_missing", "/fleet")
    with pytest.raises(retryledger.DriftError) as unexpected:
        run_job(make_policy(async_job=dict(JOB)), provider.calls(), KEY, fleet=Fleet(MemoryStore()))
    assert (unexpected.value.code, unexpected.value.path) == ("admission_unexpected", "/fleet")
    assert provider.sent == []
