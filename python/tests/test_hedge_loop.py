"""run_hedged_async on the host loop: the options every driver takes (fleet,
clock and sleep, task cancellation, hooks) and the one result shape (value,
receipt, receipt_sha256, bundle), so that ``otel.record`` takes a hedged run."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import retryledger
from retryledger import AttemptError
from retryledger.fleet import Fleet
from retryledger.hedge import HedgeAttempt, run_hedged_async
from retryledger.otel import RunTelemetry
from retryledger.stores import MemoryStore

from conftest import KEY, make_policy


def hedged_policy(delay_ms: int = 20, **overrides: Any) -> Dict[str, Any]:
    policy = make_policy(max_total_attempts=6, **overrides)
    for r in policy["routes"]:
        r["max_attempts"] = 3
    policy["hedge"] = {
        "cancelled_cost": "reserve",
        "cost_share_percent": 50,
        "delay_ms": delay_ms,
        "effects": "none",
        "max_hedges": 1,
        "routes": ["external-fallback"],
    }
    return policy


async def slow_lead(a: HedgeAttempt) -> str:
    """A lead that answers only when cancelled, a hedge that answers at once."""
    if a.hedges is None:
        await asyncio.Event().wait()
    return f"hedge of {a.hedges}"


def test_a_hedged_run_has_the_one_result_shape_and_otel_records_it() -> None:
    run = asyncio.run(run_hedged_async(hedged_policy(), slow_lead, KEY))
    assert run.terminal == "completed"
    assert run.value == run.result == "hedge of 1"
    assert run.receipt_sha256 == retryledger.digest(run.receipt)
    assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = RunTelemetry(provider.get_tracer("test")).record(run)
    assert spans.run.attributes["retryledger.receipt_sha256"] == run.receipt_sha256
    assert len(exporter.get_finished_spans()) == 1 + len(run.bundle["attempts"]["attempts"])


def test_hooks_see_every_decision_every_observed_attempt_and_the_receipt() -> None:
    seen: List[str] = []

    def on_decision(d: Dict[str, Any]) -> None:
        seen.append(f"dispatch:{d['ordinal']}:{d['route_id']}" if d["kind"] == "dispatch" else f"terminal:{d['terminal']}")
        d["ordinal"] = 99  # a copy: the run is not changed

    run = asyncio.run(
        run_hedged_async(
            hedged_policy(),
            slow_lead,
            KEY,
            on_decision=on_decision,
            on_attempt=lambda a, j: seen.append(f"attempt:{a['ordinal']}:{j.rule}:{j.to_dict()['rule']}"),
            on_terminal=lambda r: seen.append(f"receipt:{r['terminal']}"),
        )
    )
    assert run.terminal == "completed"
    assert seen == [
        "dispatch:1:private-primary",
        "dispatch:2:external-fallback",
        "attempt:2:returned:returned",
        "terminal:completed",
        "receipt:completed",
    ]
    assert [(l["ordinal"], l["reason"]) for l in run.receipt["hedge"]["losers"]] == [(1, "cancelled")]


def test_an_injected_clock_and_sleep_drive_a_retried_round_and_on_sleep_sees_the_wait() -> None:
    now = [0.0]
    slept: List[float] = []
    sleeps: List[Dict[str, Any]] = []
    calls = [0]

    async def sleep(ms: float) -> None:
        slept.append(ms)
        now[0] += ms

    async def dispatch(a: HedgeAttempt) -> str:
        calls[0] += 1
        now[0] += 10
        if calls[0] == 1:
            raise AttemptError.retryable("rate_limited")
        return "second"

    run = asyncio.run(
        run_hedged_async(
            hedged_policy(delay_ms=4000), dispatch, KEY, clock=lambda: now[0], sleep=sleep, on_sleep=sleeps.append
        )
    )
    assert run.terminal == "completed"
    assert run.value == "second"
    assert run.attempts == 2
    first, second = run.bundle["attempts"]["attempts"]
    assert first["completed_at_ms"] == 10
    assert len(sleeps) == 1
    wait = sleeps[0]["sleep_ms"]
    assert wait > 0
    assert sleeps == [
        {"ordinal": 2, "route_id": second["route_id"], "at_ms": 10, "not_before_ms": second["started_at_ms"], "sleep_ms": wait}
    ]
    assert slept == [wait]


def test_cancelling_the_task_cancels_the_attempts_in_flight() -> None:
    cancelled: List[int] = []

    async def dispatch(a: HedgeAttempt) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(a.ordinal)
            raise
        return "never"

    async def scenario() -> None:
        task = asyncio.ensure_future(run_hedged_async(hedged_policy(delay_ms=4000), dispatch, KEY))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert cancelled == [1]


def test_under_a_fleet_every_lead_and_hedge_is_admitted_and_recorded() -> None:
    store = MemoryStore()
    policy = hedged_policy(fleet={"on_store_unavailable": "fail_closed", "breaker": {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 60000}})
    run = asyncio.run(run_hedged_async(policy, slow_lead, KEY, fleet=Fleet(store)))
    assert run.terminal == "completed"
    assert run.value == "hedge of 1"
    attempts = run.bundle["attempts"]["attempts"]
    assert all("admission" in a for a in attempts)
    document, _ = store.get(f"retryledger/breaker/{attempts[1]['route_release_sha256']}")
    assert document is not None
    with pytest.raises(retryledger.DriftError) as e:
        asyncio.run(run_hedged_async(policy, slow_lead, KEY))
    assert e.value.code == "admission_missing"
