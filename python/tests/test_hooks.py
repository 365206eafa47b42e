"""Run hooks: on_decision, on_sleep, on_attempt and on_terminal see the
core's plain documents; a hook that raises is a HookWarning (code
hook_failed) and the run's decisions and receipt are what they are without
hooks."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List

import pytest

import retryledger
from retryledger import HookWarning

from conftest import KEY, FakeClock, make_policy


def flaky(step: retryledger.Step) -> str:
    if step.ordinal == 1:
        raise retryledger.AttemptError.retryable("rate_limited", retry_after_ms=250)
    if step.ordinal == 2:
        raise retryledger.AttemptError.retryable("unavailable")
    return f"ok from {step.route_id}"


class Seen:
    def __init__(self) -> None:
        self.log: List[Any] = []

    def hooks(self) -> Dict[str, Any]:
        return {
            "on_decision": lambda d: self.log.append(("decision", d)),
            "on_sleep": lambda s: self.log.append(("sleep", s)),
            "on_attempt": lambda a, j: self.log.append(("attempt", a, j.to_dict())),
            "on_terminal": lambda r: self.log.append(("terminal", r)),
        }


def raising(**names: Any) -> Dict[str, Any]:
    def boom(*args: Any) -> None:
        raise RuntimeError("hook bug")

    return {name: boom for name in ("on_decision", "on_sleep", "on_attempt", "on_terminal")}


def plain_run() -> retryledger.RunResult[str]:
    clock = FakeClock()
    return retryledger.run(make_policy(), flaky, KEY, clock=clock, sleep=clock.sleep)


def test_hooks_see_the_documents_of_the_run() -> None:
    seen = Seen()
    clock = FakeClock()
    result = retryledger.run(make_policy(), flaky, KEY, clock=clock, sleep=clock.sleep, **seen.hooks())
    kinds = [entry[0] for entry in seen.log]
    assert kinds == [
        "decision", "attempt",
        "decision", "sleep", "attempt",
        "decision", "sleep", "attempt",
        "decision", "terminal",
    ]
    decisions = [e[1] for e in seen.log if e[0] == "decision"]
    attempts = result.bundle["attempts"]["attempts"]
    # Each dispatch decision is the attempt that followed it; the last one is the terminal.
    assert len(decisions) == len(attempts) + 1
    for decision, attempt in zip(decisions, attempts):
        assert decision["kind"] == "dispatch"
        assert decision["ordinal"] == attempt["ordinal"] and decision["route_id"] == attempt["route_id"]
        assert attempt["started_at_ms"] >= decision["not_before_ms"]
    assert decisions[-1]["kind"] == "terminal" and decisions[-1]["terminal"] == "completed"
    # Each planned sleep ends at the next attempt's not_before_ms.
    sleeps = [e[1] for e in seen.log if e[0] == "sleep"]
    assert [s["ordinal"] for s in sleeps] == [2, 3]
    for s in sleeps:
        assert s["not_before_ms"] == decisions[s["ordinal"] - 1]["not_before_ms"]
        assert attempts[s["ordinal"] - 1]["started_at_ms"] == s["not_before_ms"]
        assert s["sleep_ms"] == s["not_before_ms"] - s["at_ms"] > 0
    assert sleeps[0]["sleep_ms"] >= 250  # the Retry-After floor
    assert [e[1] for e in seen.log if e[0] == "attempt"] == attempts
    assert [e[2]["outcome"].get("kind", e[2]["outcome"]["class"]) for e in seen.log if e[0] == "attempt"] == ["rate_limited", "unavailable", "success"]
    (terminal,) = [e[1] for e in seen.log if e[0] == "terminal"]
    assert terminal == result.receipt
    # The hooks changed nothing: the same run without them seals the same receipt.
    assert result.receipt_sha256 == plain_run().receipt_sha256


def test_a_raising_hook_is_a_coded_warning_and_changes_nothing() -> None:
    clock = FakeClock()
    with pytest.warns(HookWarning) as caught:
        result = retryledger.run(make_policy(), flaky, KEY, clock=clock, sleep=clock.sleep, **raising())
    warned = [w.message for w in caught if isinstance(w.message, HookWarning)]
    assert {w.code for w in warned} == {"hook_failed"}
    assert sorted({w.hook for w in warned}) == ["on_attempt", "on_decision", "on_sleep", "on_terminal"]
    # 4 decisions, 2 sleeps, 3 attempts, 1 terminal.
    assert len(warned) == 10
    assert all(isinstance(w.error, RuntimeError) and "hook bug" in str(w) for w in warned)
    assert result.value == "ok from fallback" or result.value.startswith("ok from")
    assert result.receipt_sha256 == plain_run().receipt_sha256
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"


def test_a_hook_that_mutates_what_it_was_given_changes_nothing() -> None:
    def scribble(document: Dict[str, Any], *rest: Any) -> None:
        document.clear()
        document["terminal"] = "forged"

    clock = FakeClock()
    result = retryledger.run(
        make_policy(), flaky, KEY, clock=clock, sleep=clock.sleep,
        on_decision=scribble, on_sleep=scribble, on_attempt=scribble, on_terminal=scribble,
    )
    assert result.receipt["terminal"] == "completed"
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"
    assert result.receipt_sha256 == plain_run().receipt_sha256


def test_on_terminal_sees_a_stopped_run() -> None:
    clock = FakeClock()
    receipts: List[Dict[str, Any]] = []

    def refused(step: retryledger.Step) -> str:
        raise retryledger.AttemptError.non_retryable("invalid_request")

    with pytest.raises(retryledger.RunStoppedError) as stopped:
        retryledger.run(make_policy(), refused, KEY, clock=clock, sleep=clock.sleep, on_terminal=receipts.append)
    assert receipts == [stopped.value.receipt]
    assert receipts[0]["terminal"] == "stop_non_retryable"


def test_the_async_driver_calls_the_same_hooks() -> None:
    seen = Seen()
    clock = FakeClock()

    async def dispatch(step: retryledger.Step) -> str:
        return flaky(step)

    async def sleep(ms: float) -> None:
        clock.sleep(ms)

    result = asyncio.run(retryledger.run_async(make_policy(), dispatch, KEY, clock=clock, sleep=sleep, **seen.hooks()))
    sync = Seen()
    clock2 = FakeClock()
    retryledger.run(make_policy(), flaky, KEY, clock=clock2, sleep=clock2.sleep, **sync.hooks())
    assert seen.log == sync.log
    with pytest.warns(HookWarning):
        clock3 = FakeClock()

        async def sleep3(ms: float) -> None:
            clock3.sleep(ms)

        again = asyncio.run(retryledger.run_async(make_policy(), dispatch, KEY, clock=clock3, sleep=sleep3, **raising()))
    assert again.receipt_sha256 == result.receipt_sha256


def test_the_decorator_passes_the_hooks() -> None:
    clock = FakeClock()
    receipts: List[Dict[str, Any]] = []

    @retryledger.retry(make_policy(), idempotency_key=KEY, clock=clock, sleep=clock.sleep, on_terminal=receipts.append)
    def call(step: retryledger.Step) -> str:
        return flaky(step)

    result = call.run()
    assert receipts == [result.receipt]


def test_a_stream_run_calls_the_hooks() -> None:
    clock = FakeClock()
    seen = Seen()
    policy = make_policy(stream={"mode": "buffer", "max_response_bytes": 4096})

    def provider(step: retryledger.StreamStep) -> List[str]:
        if step.ordinal == 1:
            raise retryledger.AttemptError.retryable("unavailable")
        return ["a", "b"]

    run = retryledger.run_stream(policy, provider, KEY, clock=clock, sleep=clock.sleep, **seen.hooks())
    events = list(run)
    assert events[-1].kind == "commit"
    kinds = [entry[0] for entry in seen.log]
    assert kinds == ["decision", "attempt", "decision", "sleep", "attempt", "decision", "terminal"]
    assert seen.log[-1][1] == run.receipt
    with pytest.warns(HookWarning):
        clock2 = FakeClock()
        again = retryledger.run_stream(policy, provider, KEY, clock=clock2, sleep=clock2.sleep, **raising())
        assert [e.kind for e in again] == [e.kind for e in events]
    assert again.bundle == run.bundle
