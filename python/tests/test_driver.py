"""The sync and async drivers: the reference run, classification, bounds, cancellation."""

from __future__ import annotations

import asyncio
import json
from types import TracebackType
from typing import Any, Dict, List, Optional

import pytest

import retryledger
from retryledger import AttemptError, Step

from conftest import KEY, FakeClock, make_policy, reference_bundle

RATE_LIMITED_250 = {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 250}


def reference_dispatch(clock: FakeClock, seen: List[Step]) -> Any:
    """The lab's reference script: rate limited (1,100 ms, Retry-After 250 ms),
    unavailable (100 ms), then success on the fallback (750 ms, cost 1,800)."""

    def dispatch(step: Step) -> str:
        seen.append(step)
        if step.ordinal == 1:
            clock.advance(1_100)
            step.charge(0)
            raise AttemptError(RATE_LIMITED_250)
        if step.ordinal == 2:
            clock.advance(100)
            step.charge(0)
            raise AttemptError.retryable("unavailable")
        clock.advance(750)
        step.charge(1_800)
        return "summary"

    return dispatch


def test_reference_run_reproduces_the_lab_bundle_byte_for_byte() -> None:
    clock = FakeClock()
    seen: List[Step] = []
    policy = retryledger.Policy(make_policy())
    result = retryledger.run(policy, reference_dispatch(clock, seen), KEY, clock=clock, sleep=clock.sleep)
    assert result.value == "summary"
    assert result.terminal == "completed"
    expected = reference_bundle()
    assert result.bundle == expected
    assert result.bundle_json == json.dumps(expected, separators=(",", ":"), ensure_ascii=False)
    assert result.receipt == expected["receipt"]
    # Slept exactly until each not_before: 1,350 - 1,100 and 1,650 - 1,450.
    assert clock.sleeps == [250, 200]
    assert [(s.ordinal, s.route_id, s.route_ordinal) for s in seen] == [
        (1, "private-primary", 1),
        (2, "private-primary", 2),
        (3, "external-fallback", 1),
    ]
    assert all(s.idempotency_key == KEY for s in seen)
    assert [s.remaining_ms for s in seen] == [5_000, 5_000 - 1_350, 5_000 - 1_650]
    assert [s.reserve_cost for s in seen] == [1_500, 1_500, 3_000]
    assert [s.started_at_ms for s in seen] == [0, 1_350, 1_650]
    assert {s.deadline_ms for s in seen} == {5_000}
    attempts = expected["attempts"]["attempts"]
    assert [s.route_release_sha256 for s in seen] == [a["route_release_sha256"] for a in attempts]
    verdict = retryledger.verify_bundle(result.bundle_json)
    assert verdict["kind"] == "verified"
    assert verdict["receipt_sha256"] == result.receipt_sha256


def test_a_policy_given_as_a_document_is_compiled_once_per_text() -> None:
    """As the npm driver's: the same text is compiled once (the most recently
    used 16 kept); a document changed between runs is another text, honored."""
    from retryledger import _api

    def once(policy: Any) -> retryledger.RunResult[str]:
        clock = FakeClock()
        return retryledger.run(policy, lambda step: "ok", KEY, clock=clock, sleep=clock.sleep)

    policy = make_policy()
    first = once(policy)
    cached = _api._COMPILED_BY_TEXT.get(_api.to_text(policy))
    assert cached is not None and cached.sha256 == first.receipt["policy_sha256"]
    assert once(policy).receipt == first.receipt
    assert once(json.dumps(policy)).receipt["policy_sha256"] == first.receipt["policy_sha256"]
    # The same dict changed: another text, another policy.
    policy["deadline_ms"] += 1
    changed = once(policy)
    assert changed.receipt["policy_sha256"] != first.receipt["policy_sha256"]
    assert changed.bundle["policy"]["deadline_ms"] == policy["deadline_ms"]
    # A broken policy is refused with its code every time, and never kept.
    policy["routes"] = []
    for _ in range(2):
        with pytest.raises(retryledger.PolicyError):
            once(policy)
    # Bounded: many policies keep the 16 most recently used.
    for n in range(40):
        once(make_policy(deadline_ms=10_000 + n))
    assert len(_api._COMPILED_BY_TEXT) == 16


def test_async_reference_run_matches_the_sync_one() -> None:
    clock = FakeClock()
    seen: List[Step] = []
    sync_dispatch = reference_dispatch(clock, seen)

    async def dispatch(step: Step) -> str:
        await asyncio.sleep(0)
        return sync_dispatch(step)  # type: ignore[no-any-return]

    result = asyncio.run(
        retryledger.run_async(make_policy(), dispatch, KEY, clock=clock, sleep=clock.async_sleep)
    )
    assert result.value == "summary"
    assert result.bundle == reference_bundle()
    assert clock.sleeps == [250, 200]


def test_no_sleep_call_when_nothing_to_wait_for() -> None:
    ticks = iter(range(0, 100_000, 150))  # every clock read is 150 ms later
    sleeps: List[float] = []

    def dispatch(step: Step) -> str:
        if step.ordinal == 1:
            raise AttemptError.retryable("unavailable")
        return "ok"

    result = retryledger.run(make_policy(), dispatch, KEY, clock=lambda: float(next(ticks)), sleep=sleeps.append)
    assert result.value == "ok"
    assert sleeps == []
    first, second = result.receipt["schedule"]
    assert second["not_before_ms"] == first["completed_at_ms"] + 100
    assert second["started_at_ms"] == second["not_before_ms"] + 50


def test_real_clock_sleeps_until_not_before() -> None:
    policy = make_policy(backoff={"base_ms": 30, "max_ms": 60, "retry_after_cap_ms": 1_000})
    calls: List[int] = []

    def dispatch(step: Step) -> str:
        calls.append(step.ordinal)
        if step.ordinal == 1:
            raise AttemptError.retryable("rate_limited", retry_after_ms=80)
        return "ok"

    result = retryledger.run(policy, dispatch, KEY)
    first, second = result.receipt["schedule"]
    assert second["not_before_ms"] == first["completed_at_ms"] + 80
    assert second["started_at_ms"] >= second["not_before_ms"]
    assert calls == [1, 2]


def test_wrong_idempotency_key_is_refused_before_any_dispatch() -> None:
    def dispatch(step: Step) -> str:
        raise AssertionError("dispatched")

    with pytest.raises(retryledger.DriftError) as info:
        retryledger.run(make_policy(), dispatch, "another key")
    assert info.value.code == "idempotency_key_drift"
    assert isinstance(info.value, ValueError)


def test_unrecognized_exception_is_indeterminate_never_retried() -> None:
    calls: List[int] = []
    original = KeyError("boom")

    def dispatch(step: Step) -> str:
        calls.append(step.ordinal)
        raise original

    with pytest.raises(retryledger.UnrecognizedDispatchError) as info:
        retryledger.run(make_policy(), dispatch, KEY, clock=FakeClock())
    err = info.value
    assert calls == [1]
    assert err.__cause__ is original
    assert err.code == "stop_indeterminate" == err.terminal
    attempt = err.bundle["attempts"]["attempts"][0]
    assert attempt["outcome"] == {"class": "indeterminate", "kind": "unknown_provider_acceptance"}
    assert attempt["cost"] == 1_500  # never charged: the reservation
    assert retryledger.verify_bundle(err.bundle)["kind"] == "verified"


class FakeStatusError(Exception):
    """Shaped like openai's APIStatusError: status_code and response.headers."""

    class _Response:
        def __init__(self, headers: Dict[str, str]) -> None:
            self.headers = headers

    def __init__(self, status: int, headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.response = self._Response(headers or {})


def test_http_status_exceptions_are_classified() -> None:
    clock = FakeClock()

    def dispatch(step: Step) -> str:
        if step.ordinal == 1:
            raise FakeStatusError(429, {"retry-after-ms": "700", "retry-after": "9"})
        if step.ordinal == 2:
            raise FakeStatusError(503)
        return "ok"

    result = retryledger.run(make_policy(), dispatch, KEY, clock=clock, sleep=clock.sleep)
    outcomes = [a["outcome"] for a in result.bundle["attempts"]["attempts"]]
    assert outcomes[0] == {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 700}
    assert outcomes[1] == {"class": "retryable", "kind": "unavailable"}
    assert clock.sleeps[0] == 700


def test_non_retryable_stops_without_fallback() -> None:
    original = FakeStatusError(403)

    def dispatch(step: Step) -> str:
        raise original

    with pytest.raises(retryledger.RunStoppedError) as info:
        retryledger.run(make_policy(), dispatch, KEY, clock=FakeClock())
    assert not isinstance(info.value, retryledger.UnrecognizedDispatchError)
    assert info.value.terminal == "stop_non_retryable"
    assert info.value.__cause__ is original
    assert info.value.receipt["attempt_count"] == 1


def test_route_exhaustion_raises_with_the_bundle() -> None:
    clock = FakeClock()
    policy = make_policy(max_total_attempts=10)

    def dispatch(step: Step) -> str:
        step.charge(10)
        raise AttemptError.retryable("unavailable")

    with pytest.raises(retryledger.RunStoppedError) as info:
        retryledger.run(policy, dispatch, KEY, clock=clock, sleep=clock.sleep)
    err = info.value
    assert err.code == "stop_route_exhausted"
    assert err.receipt["attempt_count"] == 4
    assert err.receipt["total_cost"] == 40
    assert "stop_route_exhausted" in str(err)
    assert retryledger.verify_bundle(err.bundle_json)["kind"] == "verified"


def test_classify_hook_and_charge_validation() -> None:
    def classify(exc: BaseException) -> Optional[Dict[str, Any]]:
        if isinstance(exc, TimeoutError):
            return {"class": "retryable", "kind": "timeout_before_response"}
        return None

    clock = FakeClock()

    def dispatch(step: Step) -> str:
        if step.ordinal == 1:
            raise TimeoutError()
        with pytest.raises(retryledger.DecodeError):
            step.charge(-1)
        with pytest.raises(retryledger.DecodeError):
            step.charge(1.5)  # type: ignore[arg-type]
        step.charge(5)
        step.charge(7)
        return "ok"

    result = retryledger.run(make_policy(), dispatch, KEY, classify=classify, clock=clock, sleep=clock.sleep)
    attempts = result.bundle["attempts"]["attempts"]
    assert attempts[0]["outcome"]["kind"] == "timeout_before_response"
    assert attempts[1]["cost"] == 12


def test_attempt_error_validates_its_outcome() -> None:
    with pytest.raises(retryledger.DecodeError) as info:
        AttemptError({"class": "retryable", "kind": "sleepy"})
    assert info.value.code == "invalid_value"
    with pytest.raises(retryledger.DecodeError):
        AttemptError('{"class":"success"}')
    err = AttemptError.retryable("rate_limited", retry_after_ms=5)
    assert err.outcome == {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 5}


def test_late_success_loses_to_the_deadline() -> None:
    clock = FakeClock()

    def dispatch(step: Step) -> str:
        clock.advance(6_000)
        return "late"

    with pytest.raises(retryledger.RunStoppedError) as info:
        retryledger.run(make_policy(), dispatch, KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_deadline"


def test_cancel_between_attempts_records_cancelled_at() -> None:
    async def main() -> retryledger.RunCancelledError:
        dispatched = asyncio.Event()

        async def dispatch(step: Step) -> str:
            dispatched.set()
            raise AttemptError.retryable("rate_limited", retry_after_ms=5_000)

        policy = make_policy(backoff={"base_ms": 100, "max_ms": 1_000, "retry_after_cap_ms": 3_000})
        task = asyncio.ensure_future(retryledger.run_async(policy, dispatch, KEY))
        await dispatched.wait()
        await asyncio.sleep(0.02)  # the driver is now sleeping toward not_before
        task.cancel()
        try:
            await task
        except asyncio.CancelledError as e:
            assert isinstance(e, retryledger.RunCancelledError)
            return e
        raise AssertionError("not cancelled")

    cancelled = asyncio.run(main())
    assert cancelled.terminal == "stop_cancelled"
    attempts = cancelled.bundle["attempts"]
    assert len(attempts["attempts"]) == 1
    assert attempts["cancelled_at_ms"] >= attempts["attempts"][0]["completed_at_ms"]
    assert retryledger.verify_bundle(cancelled.bundle)["kind"] == "verified"


def test_cancel_during_dispatch_records_an_indeterminate_attempt() -> None:
    async def main() -> retryledger.RunCancelledError:
        started = asyncio.Event()

        async def dispatch(step: Step) -> str:
            started.set()
            step.charge(42)
            await asyncio.sleep(10)
            return "never"

        seen: List[retryledger.RunCancelledError] = []
        task = asyncio.ensure_future(retryledger.run_async(make_policy(), dispatch, KEY, on_cancel=seen.append))
        await started.wait()
        task.cancel()
        try:
            await task
        except retryledger.RunCancelledError as e:
            assert seen == [e]
            return e
        raise AssertionError("not cancelled")

    cancelled = asyncio.run(main())
    assert cancelled.terminal == "stop_indeterminate"
    (attempt,) = cancelled.bundle["attempts"]["attempts"]
    assert attempt["outcome"] == {"class": "indeterminate", "kind": "unknown_provider_acceptance"}
    assert attempt["cost"] == 42
    assert retryledger.verify_bundle(cancelled.bundle_json)["kind"] == "verified"


def test_on_cancel_sees_the_bundle_when_wait_for_replaces_the_cancellation() -> None:
    seen: List[retryledger.RunCancelledError] = []

    async def dispatch(step: Step) -> str:
        await asyncio.sleep(10)
        return "never"

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(retryledger.run_async(make_policy(), dispatch, KEY, on_cancel=seen.append), 0.05)

    asyncio.run(main())
    (cancelled,) = seen
    assert cancelled.terminal == "stop_indeterminate"
    assert retryledger.verify_bundle(cancelled.bundle)["kind"] == "verified"


def test_async_unrecognized_exception() -> None:
    original = RuntimeError("socket said no")

    async def dispatch(step: Step) -> str:
        raise original

    with pytest.raises(retryledger.UnrecognizedDispatchError) as info:
        asyncio.run(retryledger.run_async(make_policy(), dispatch, KEY))
    assert info.value.__cause__ is original
    assert info.value.receipt["attempt_count"] == 1


# ---- the sync loop's edges: what the clock gives, what dispatch raises ------


def test_an_integer_clock_gives_integer_waits() -> None:
    """``clock() - t0`` and ``not_before - now`` are computed as Python does:
    a clock of ints sleeps ints, a clock of floats floats."""
    for start, kind in ((1_000, int), (1_000.5, float)):
        now = [start]
        sleeps: List[Any] = []

        def sleep(ms: Any) -> None:
            sleeps.append(ms)
            now[0] += ms

        def dispatch(step: Step) -> str:
            if step.ordinal == 1:
                raise AttemptError.retryable("rate_limited", retry_after_ms=250)
            return "ok"

        result = retryledger.run(make_policy(), dispatch, KEY, clock=lambda: now[0], sleep=sleep)
        assert result.value == "ok"
        assert sleeps == [250] and type(sleeps[0]) is kind
        assert [s["started_at_ms"] for s in result.receipt["schedule"]] == [0, 250]


def test_an_exception_that_is_not_an_exception_is_never_recorded() -> None:
    """``KeyboardInterrupt`` and ``SystemExit`` raised by dispatch leave the
    run as they are: propagated, nothing recorded, no receipt."""
    for error in (KeyboardInterrupt(), SystemExit(3)):
        calls: List[int] = []

        def dispatch(step: Step) -> str:
            calls.append(step.ordinal)
            raise error

        clock = FakeClock()
        with pytest.raises(type(error)) as caught:
            retryledger.run(make_policy(), dispatch, KEY, clock=clock, sleep=clock.sleep)
        assert caught.value is error
        assert calls == [1]


def test_a_broken_clock_is_an_error_of_the_caller() -> None:
    """A clock that gives no number raises ``TypeError`` before any dispatch; one
    that gives NaN after the dispatch raises ``ValueError`` (``int(nan)``)."""
    calls: List[int] = []

    def dispatch(step: Step) -> str:
        calls.append(step.ordinal)
        return "ok"

    with pytest.raises(TypeError):
        not_a_clock: Any = lambda: "soon"
        retryledger.run(make_policy(), dispatch, KEY, clock=not_a_clock, sleep=lambda _ms: None)
    assert calls == []
    readings = iter([0.0, 0.0, float("nan")])
    with pytest.raises(ValueError, match="NaN"):
        retryledger.run(make_policy(), dispatch, KEY, clock=lambda: next(readings), sleep=lambda _ms: None)
    assert calls == [1]


def test_the_cause_of_a_stopped_run_keeps_its_traceback() -> None:
    """The error dispatch raised is the stopped run's ``__cause__``, with the
    dispatch's frame in its traceback."""

    def dispatch(step: Step) -> str:
        raise ValueError(f"unknown failure on attempt {step.ordinal}")

    clock = FakeClock()
    with pytest.raises(retryledger.RunStoppedError) as caught:
        retryledger.run(make_policy(), dispatch, KEY, clock=clock, sleep=clock.sleep)
    cause = caught.value.__cause__
    assert isinstance(cause, ValueError) and str(cause) == "unknown failure on attempt 1"
    assert cause.__traceback__ is not None
    frames: List[str] = []
    tb: Optional[TracebackType] = cause.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "dispatch" in frames
