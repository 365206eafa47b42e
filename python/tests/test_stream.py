"""The streaming drivers (run_stream, run_stream_async) against scripted
provider streams: in every case the events the consumer received are the
sealed bundle's stream_events one to one, and the bundle replays verified."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Tuple

import pytest

import retryledger
from retryledger import StreamEvent, StreamStep

from conftest import KEY, ROOT, FakeClock, make_policy

Row = Tuple[str, str, int, int]


def policy(mode: str, **stream: Any) -> Dict[str, Any]:
    contract: Dict[str, Any] = {"mode": mode, "max_response_bytes": 4096}
    contract.update(stream)
    return make_policy(stream=contract)


def rows(events: List[StreamEvent]) -> List[Row]:
    return [(e.kind, e.status, e.attempt, e.sequence) for e in events]


def logged(run: Any) -> List[Row]:
    return [(e["kind"], e["status"], e["attempt_ordinal"], e["sequence"]) for e in run.bundle["stream_events"]]


def check_sealed(run: Any, events: List[StreamEvent]) -> None:
    """The consumer's events are the sealed log, and the bundle replays verified."""
    assert rows(events) == logged(run)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    verdict = retryledger.verify_bundle(run.bundle_json)
    assert verdict["kind"] == "verified", verdict


class Provider:
    """Scripted streams, one per attempt: each a list of items, where an
    exception instance is raised in place and ``("advance", ms)`` moves the
    fake clock. Records the steps, and whether each stream was closed."""

    def __init__(self, clock: Optional[FakeClock], *scripts: List[Any]) -> None:
        self.clock = clock
        self.scripts = list(scripts)
        self.steps: List[StreamStep] = []
        self.closed: List[bool] = []
        self.finished: List[bool] = []

    def __call__(self, step: StreamStep) -> Iterator[Any]:
        self.steps.append(step)
        script = self.scripts[len(self.steps) - 1]
        if isinstance(script, BaseException):
            raise script
        index = len(self.closed)
        self.closed.append(False)
        self.finished.append(False)
        return self._gen(script, index)

    def _gen(self, script: List[Any], index: int) -> Iterator[Any]:
        try:
            for item in script:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, tuple) and item[0] == "advance":
                    assert self.clock is not None
                    self.clock.advance(item[1])
                    continue
                yield item
            self.finished[index] = True
        except GeneratorExit:
            self.closed[index] = True
            raise


def drive(mode: str, *scripts: Any, reader: Any = None, **stream: Any) -> Tuple[Any, List[StreamEvent], Provider, Optional[BaseException]]:
    clock = FakeClock()
    provider = Provider(clock, *scripts)
    run = retryledger.run_stream(policy(mode, **stream), provider, KEY, reader=reader, clock=clock, sleep=clock.sleep)
    events: List[StreamEvent] = []
    error: Optional[BaseException] = None
    try:
        for ev in run:
            events.append(ev)
    except retryledger.RunStoppedError as exc:
        error = exc
    return run, events, provider, error


TEXT = ["The incident", " began at 09:14", " UTC."]
CUT = ConnectionResetError(104, "connection reset by peer")


class Seq:
    """SDK-like events: dicts with text, sequence number, response id, terminal."""

    terminal_at_end = False

    def text(self, event: Mapping[str, Any]) -> str:
        return str(event.get("t", ""))

    def sequence(self, event: Mapping[str, Any]) -> Optional[int]:
        seq = event.get("seq")
        return seq if isinstance(seq, int) else None

    def response_id(self, event: Mapping[str, Any]) -> Optional[str]:
        rid = event.get("id")
        return rid if isinstance(rid, str) else None

    def is_terminal(self, event: Mapping[str, Any]) -> bool:
        return bool(event.get("end"))

    def usage(self, event: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
        usage = event.get("usage")
        return usage if isinstance(usage, dict) else None


def numbered(texts: List[str], first: int, rid: str = "resp_7Qx", end: bool = False) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = [{"t": t, "seq": first + i, "id": rid} for i, t in enumerate(texts)]
    if end:
        out.append({"seq": first + len(texts), "id": rid, "end": True, "usage": {"input": 10, "output": 4}})
    return out


# ---- every mode, clean ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["buffer", "tentative", "continuation", "restart"])
def test_clean_stream_in_every_mode(mode: str) -> None:
    run, events, provider, error = drive(mode, list(TEXT))
    assert error is None and run.terminal == "completed"
    status = "committed" if mode == "buffer" else "tentative"
    assert rows(events) == [("delta", status, 1, 1), ("delta", status, 1, 2), ("delta", status, 1, 3), ("commit", "committed", 1, 4)]
    assert [e.text for e in events[:3]] == TEXT and [e.data for e in events[:3]] == TEXT
    assert events[3].text is None and events[3].data is None
    check_sealed(run, events)
    assert run.receipt["stream"]["committed_events"] == 3
    assert len(provider.steps) == 1 and provider.steps[0].continuation is None


@pytest.mark.parametrize("mode", ["buffer", "tentative", "continuation", "restart"])
def test_cut_before_output_is_retried_invisibly(mode: str) -> None:
    run, events, provider, error = drive(mode, [CUT], list(TEXT))
    assert error is None and run.terminal == "completed"
    # Nothing of the first attempt reaches the consumer, not even an invalidate.
    assert [e.attempt for e in events] == [2, 2, 2, 2]
    assert [e.kind for e in events] == ["delta", "delta", "delta", "commit"]
    assert len(provider.steps) == 2
    first = run.bundle["attempts"]["attempts"][0]
    assert first["outcome"] == {"class": "retryable", "kind": "unavailable"} and first["stream"]["events"] == 0
    check_sealed(run, events)


def test_failure_before_the_stream_opened_is_retried() -> None:
    run, events, provider, error = drive("tentative", retryledger.AttemptError.retryable("unavailable"), list(TEXT))
    assert error is None and [e.attempt for e in events] == [2, 2, 2, 2]
    check_sealed(run, events)


# ---- output then a failure -----------------------------------------------------


def test_tentative_cut_after_output_invalidates_before_the_next_attempt() -> None:
    clock = FakeClock()
    provider = Provider(clock, ["The incident", " beg", CUT], list(TEXT))
    run = retryledger.run_stream(policy("tentative"), provider, KEY, clock=clock, sleep=clock.sleep)
    events: List[StreamEvent] = []
    dispatched_when_seen: List[int] = []
    for ev in run:
        events.append(ev)
        dispatched_when_seen.append(len(provider.steps))
    assert rows(events) == [
        ("delta", "tentative", 1, 1),
        ("delta", "tentative", 1, 2),
        ("invalidate", "invalidated", 1, 3),
        ("delta", "tentative", 2, 4),
        ("delta", "tentative", 2, 5),
        ("delta", "tentative", 2, 6),
        ("commit", "committed", 2, 7),
    ]
    # The invalidate reached the consumer before the second attempt was dispatched.
    assert dispatched_when_seen[:3] == [1, 1, 1] and dispatched_when_seen[3] == 2
    assert provider.closed == [False, False]
    check_sealed(run, events)
    assert run.receipt["stream"]["invalidated_events"] == 2


def test_stream_without_terminal_event_is_a_cut() -> None:
    # A plain iterable that ends normally is terminal for the text reader; an
    # SDK-like stream that ends without its terminal event is not.
    run, events, provider, error = drive(
        "tentative", numbered(["The", " inc"], 0), numbered(TEXT, 0, rid="resp_2", end=True), reader=Seq()
    )
    assert error is None
    assert [e.kind for e in events] == ["delta", "delta", "invalidate", "delta", "delta", "delta", "delta", "commit"]
    assert run.bundle["attempts"]["attempts"][0]["stream"]["terminal_event"] is False
    check_sealed(run, events)


def test_restart_stops_indeterminate_after_the_invalidate() -> None:
    run, events, provider, error = drive("restart", ["The incident", " beg", CUT], list(TEXT))
    assert isinstance(error, retryledger.RunStoppedError)
    assert error.code == "stop_indeterminate" and run.terminal == "stop_indeterminate"
    assert rows(events) == [("delta", "tentative", 1, 1), ("delta", "tentative", 1, 2), ("invalidate", "invalidated", 1, 3)]
    assert len(provider.steps) == 1
    assert error.__cause__ is CUT
    check_sealed(run, events)
    assert error.bundle == run.bundle


def test_continuation_resumes_the_same_response_without_duplicate_or_gap() -> None:
    full = ["The incident", " began at 09:14", " UTC.", " Severity 2:", " checkout latency."]
    first = numbered(full[:3], 0) + [CUT]
    resumed = numbered(full[3:], 3, end=True)
    run, events, provider, error = drive("continuation", first, resumed, reader=Seq())
    assert error is None and run.terminal == "completed"
    assert provider.steps[0].continuation is None
    assert provider.steps[1].continuation == {"continues_ordinal": 1, "response_id": "resp_7Qx", "starting_after": 2}
    deltas = [e for e in events if e.kind == "delta"]
    assert [e.data["seq"] for e in deltas] == list(range(0, 6))  # provider numbers: no duplicate, no gap
    assert "".join(e.text or "" for e in deltas) == "".join(full)
    assert [e.attempt for e in deltas] == [1, 1, 1, 2, 2, 2]
    assert [e.kind for e in events] == ["delta"] * 6 + ["commit"]
    assert all(e.status == "tentative" for e in deltas)
    check_sealed(run, events)
    attempts = run.bundle["attempts"]["attempts"]
    assert attempts[1]["stream"]["continues_ordinal"] == 1 and attempts[1]["stream"]["starting_after"] == 2
    assert run.receipt["stream"]["resumed_attempts"] == 1


def test_continuation_that_skips_is_a_sequence_gap() -> None:
    first = numbered(TEXT, 0) + [CUT]
    resumed = numbered([" Severity"], 5, end=True)  # starting_after is 2: 3 was due
    run, events, provider, error = drive("continuation", first, resumed, reader=Seq())
    assert isinstance(error, retryledger.RunStoppedError) and error.code == "stop_non_retryable"
    assert [e.kind for e in events] == ["delta", "delta", "delta", "invalidate"]
    assert run.bundle["attempts"]["attempts"][1]["stream"]["violation"] == "sequence_gap"
    assert provider.closed == [False, True]
    check_sealed(run, events)


def test_buffer_yields_nothing_before_the_commit() -> None:
    clock = FakeClock()
    provider = Provider(clock, ["The incident", " beg", CUT], list(TEXT))
    run = retryledger.run_stream(policy("buffer"), provider, KEY, clock=clock, sleep=clock.sleep)
    events: List[StreamEvent] = []
    for ev in run:
        # The first event arrives only once the successful stream has ended.
        assert provider.finished == [False, True]
        events.append(ev)
    assert rows(events) == [
        ("delta", "committed", 2, 1),
        ("delta", "committed", 2, 2),
        ("delta", "committed", 2, 3),
        ("commit", "committed", 2, 4),
    ]
    assert [e.text for e in events[:3]] == TEXT
    check_sealed(run, events)


# ---- violations --------------------------------------------------------------------


def test_sequence_back_is_a_violation_and_closes_the_stream() -> None:
    items = numbered(["The", " incident"], 0) + [{"t": " again", "seq": 1, "id": "resp_7Qx"}, {"t": "never"}]
    run, events, provider, error = drive("tentative", items, reader=Seq())
    assert isinstance(error, retryledger.RunStoppedError) and error.code == "stop_non_retryable"
    assert rows(events) == [("delta", "tentative", 1, 1), ("delta", "tentative", 1, 2), ("invalidate", "invalidated", 1, 3)]
    stream = run.bundle["attempts"]["attempts"][0]["stream"]
    assert stream["violation"] == "sequence_back" and stream["events"] == 2 and stream["last_sequence"] == 1
    assert provider.closed == [True]
    check_sealed(run, events)


def test_oversize_event_is_event_too_large() -> None:
    run, events, provider, error = drive("tentative", ["ok", "x" * 200, "never"], max_response_bytes=100)
    assert isinstance(error, retryledger.RunStoppedError) and error.code == "stop_non_retryable"
    assert [e.kind for e in events] == ["delta", "invalidate"]
    assert run.bundle["attempts"]["attempts"][0]["stream"]["violation"] == "event_too_large"
    assert provider.closed == [True]
    check_sealed(run, events)


def test_response_over_the_limit_is_response_too_large() -> None:
    run, events, provider, error = drive("buffer", ["a" * 40, "é" * 20, "b" * 40], max_response_bytes=100)
    assert isinstance(error, retryledger.RunStoppedError) and error.code == "stop_non_retryable"
    assert events == []  # buffered: nothing reached the consumer
    stream = run.bundle["attempts"]["attempts"][0]["stream"]
    assert stream["violation"] == "response_too_large" and stream["bytes"] == 80 and stream["events"] == 2
    assert provider.closed == [True]
    check_sealed(run, events)


def test_json_decode_error_mid_stream_is_malformed_event() -> None:
    bad = json.JSONDecodeError("Expecting value", "data: {oops", 6)
    run, events, provider, error = drive("tentative", ["The", bad])
    assert isinstance(error, retryledger.RunStoppedError) and error.code == "stop_non_retryable"
    assert run.bundle["attempts"]["attempts"][0]["stream"]["violation"] == "malformed_event"
    assert [e.kind for e in events] == ["delta", "invalidate"]
    check_sealed(run, events)


def test_impossible_usage_is_a_violation() -> None:
    items: List[Any] = numbered(["The"], 0) + [{"seq": 1, "usage": {"input": -3}, "end": True}]
    run, events, provider, error = drive("tentative", items, reader=Seq())
    assert isinstance(error, retryledger.RunStoppedError)
    assert run.bundle["attempts"]["attempts"][0]["stream"]["violation"] == "impossible_usage"
    check_sealed(run, events)


def test_usage_is_charged_with_a_price_schedule() -> None:
    # The policy and schedule of tests/vectors/price.json (the route releases the schedule prices).
    case = next(
        c for c in json.loads((ROOT / "tests/vectors/price.json").read_text())["cases"]
        if c["name"] == "price_schedule_prices_every_route"
    )
    document = json.loads(case["input"]["policy"])
    document["stream"] = {"mode": "tentative", "max_response_bytes": 4096}
    schedule = json.loads(case["input"]["schedule"])
    release = document["routes"][0]["route_release_sha256"]
    clock = FakeClock()
    provider = Provider(clock, numbered(TEXT, 0, end=True))
    run = retryledger.run_stream(document, provider, KEY, reader=Seq(), clock=clock, sleep=clock.sleep, price_schedule=schedule)
    events = list(run)
    assert run.terminal == "completed"
    expected = retryledger.price_cost(schedule, release, {"input": 10, "output": 4})
    assert expected > 0
    assert run.bundle["attempts"]["attempts"][0]["cost"] == expected
    check_sealed(run, events)


# ---- time ----------------------------------------------------------------------


def test_sync_idle_timeout_is_checked_after_each_event() -> None:
    slow = ["The incident", ("advance", 600), " began"]
    run, events, provider, error = drive("tentative", slow, list(TEXT), idle_timeout_ms=500, first_byte_timeout_ms=1000)
    assert error is None and run.terminal == "completed"
    assert rows(events)[:2] == [("delta", "tentative", 1, 1), ("invalidate", "invalidated", 1, 2)]
    assert [e.text for e in events if e.attempt == 1 and e.kind == "delta"] == ["The incident"]  # the late one was not taken
    first = run.bundle["attempts"]["attempts"][0]
    assert first["outcome"]["kind"] == "timeout_before_response" or first["stream"]["events"] == 1
    assert provider.closed == [True, False]
    # The SDK's read timeout: the longer of the two, within the deadline.
    assert provider.steps[0].timeout_s == 1.0 and provider.steps[0].idle_timeout_s == 0.5
    check_sealed(run, events)


def test_async_idle_timeout_cancels_only_a_really_idle_read() -> None:
    closed: List[bool] = []

    async def stream(attempt: int) -> AsyncIterator[str]:
        ended = False
        try:
            yield "The incident"
            await asyncio.sleep(0.02)  # under the idle limit: not a timeout
            yield " began"
            if attempt == 1:
                await asyncio.sleep(5)  # idle far past the limit
            yield " at 09:14"
            ended = True
        finally:
            closed.append(not ended)  # stopped (cancelled or closed) before its end

    steps: List[StreamStep] = []

    def dispatch(step: StreamStep) -> AsyncIterator[str]:
        steps.append(step)
        return stream(len(steps))

    async def main() -> Tuple[Any, List[StreamEvent], float]:
        run = retryledger.run_stream_async(policy("tentative", idle_timeout_ms=150), dispatch, KEY)
        t = time.monotonic()
        events: List[StreamEvent] = []
        async for ev in run:
            events.append(ev)
            await asyncio.sleep(0.2)  # a slow consumer is not an idle provider
        return run, events, time.monotonic() - t

    run, events, took = asyncio.run(main())
    assert took < 4
    assert [(e.kind, e.attempt) for e in events] == [
        ("delta", 1), ("delta", 1), ("invalidate", 1), ("delta", 2), ("delta", 2), ("delta", 2), ("commit", 2)
    ]
    assert closed == [True, False]
    first = run.bundle["attempts"]["attempts"][0]
    assert first["stream"]["events"] == 2
    check_sealed(run, events)


def test_async_first_byte_timeout_before_the_stream_opens() -> None:
    async def slow_open(step: StreamStep) -> List[str]:
        if step.ordinal == 1:
            await asyncio.sleep(5)
        return list(TEXT)

    async def main() -> Tuple[Any, List[StreamEvent]]:
        run = retryledger.run_stream_async(policy("tentative", first_byte_timeout_ms=100), slow_open, KEY)
        return run, [ev async for ev in run]

    run, events = asyncio.run(main())
    assert [e.attempt for e in events] == [2, 2, 2, 2]
    assert run.bundle["attempts"]["attempts"][0]["outcome"]["kind"] == "timeout_before_response"
    check_sealed(run, events)


# ---- the consumer stops ------------------------------------------------------------


def test_early_break_closes_the_stream_and_seals() -> None:
    clock = FakeClock()
    provider = Provider(clock, list(TEXT) + ["more"] * 10)
    run = retryledger.run_stream(policy("tentative"), provider, KEY, clock=clock, sleep=clock.sleep)
    events: List[StreamEvent] = []
    with run:
        for ev in run:
            events.append(ev)
            if len(events) == 2:
                break
    assert provider.closed == [True]
    assert run.terminal == "stop_indeterminate"
    attempt = run.bundle["attempts"]["attempts"][0]
    assert attempt["outcome"]["kind"] == "stream_interrupted_after_output"
    # What the consumer saw is the log; the log closes with the invalidate it left before.
    assert logged(run) == rows(events) + [("invalidate", "invalidated", 1, 3)]
    assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"


def test_async_early_break_closes_the_stream_and_seals() -> None:
    closed: List[bool] = []

    async def stream() -> AsyncIterator[str]:
        try:
            for t in TEXT * 5:
                yield t
        finally:
            closed.append(True)

    async def main() -> Tuple[Any, List[StreamEvent]]:
        run = retryledger.run_stream_async(policy("tentative"), lambda step: stream(), KEY)
        events: List[StreamEvent] = []
        async with run:
            async for ev in run:
                events.append(ev)
                if len(events) == 1:
                    break
        return run, events

    run, events = asyncio.run(main())
    assert closed == [True]
    assert run.terminal == "stop_indeterminate"
    assert logged(run) == rows(events) + [("invalidate", "invalidated", 1, 2)]
    assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"


def test_async_task_cancellation_raises_run_cancelled() -> None:
    async def stream() -> AsyncIterator[str]:
        yield "The"
        await asyncio.sleep(10)
        yield "never"

    seen: List[retryledger.RunCancelledError] = []

    async def consume(run: retryledger.AsyncStreamRun, events: List[StreamEvent]) -> None:
        async for ev in run:
            events.append(ev)

    async def main() -> Tuple[Any, List[StreamEvent]]:
        run = retryledger.run_stream_async(policy("tentative"), lambda step: stream(), KEY, on_cancel=seen.append)
        events: List[StreamEvent] = []
        task = asyncio.ensure_future(consume(run, events))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return run, events

    run, events = asyncio.run(main())
    assert len(seen) == 1 and seen[0].code == "stop_indeterminate"
    assert rows(events) == [("delta", "tentative", 1, 1)]
    assert run.terminal == "stop_indeterminate"
    assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"


def test_async_run_matches_the_sync_one() -> None:
    full = ["The incident", " began at 09:14", " UTC.", " Severity 2:"]

    async def agen(items: List[Any]) -> AsyncIterator[Any]:
        for item in items:
            if isinstance(item, BaseException):
                raise item
            yield item

    scripts: List[List[Any]] = [numbered(full[:2], 0) + [CUT], numbered(full[2:], 2, end=True)]
    steps: List[StreamStep] = []

    async def dispatch(step: StreamStep) -> AsyncIterator[Any]:
        steps.append(step)
        return agen(scripts[len(steps) - 1])

    async def main() -> Tuple[Any, List[StreamEvent]]:
        clock = FakeClock()
        run = retryledger.run_stream_async(
            policy("continuation"), dispatch, KEY, reader=Seq(), clock=clock, sleep=clock.async_sleep
        )
        return run, [ev async for ev in run]

    run, events = asyncio.run(main())
    sync_run, sync_events, _, _ = drive("continuation", *scripts, reader=Seq())
    assert rows(events) == rows(sync_events)
    assert steps[1].continuation == {"continues_ordinal": 1, "response_id": "resp_7Qx", "starting_after": 1}
    assert run.receipt_sha256 == sync_run.receipt_sha256
    check_sealed(run, events)


def test_policy_without_a_stream_contract_is_refused() -> None:
    with pytest.raises(retryledger.PolicyError) as info:
        retryledger.run_stream(make_policy(), lambda step: iter(()), KEY)
    assert info.value.code == "invalid_stream_contract"


def test_sealed_run_is_unavailable_before_the_end() -> None:
    run = retryledger.run_stream(policy("tentative"), lambda step: iter(TEXT), KEY)
    with pytest.raises(RuntimeError):
        run.terminal
    it = iter(run)
    next(it)
    with pytest.raises(RuntimeError):
        iter(run)
    rest = list(it)
    assert run.terminal == "completed" and len(rest) == 3


def test_events_without_text_are_held_back_until_the_first_text() -> None:
    # A prelude without text (a role chunk, response.created, message_start)
    # and then a cut: nothing reached the consumer, so the retry is invisible.
    prelude: List[Any] = [{"seq": 0, "id": "resp_a"}, {"seq": 1, "id": "resp_a"}]
    clean = [{"seq": 0, "id": "resp_b"}] + numbered(TEXT, 1, rid="resp_b", end=True)
    run, events, provider, error = drive("continuation", prelude + [CUT], clean, reader=Seq())
    assert error is None and {e.attempt for e in events} == {2}
    assert provider.steps[1].continuation is None  # nothing delivered: a fresh response, not a resumption
    # Held events are delivered, in order, with the first text.
    assert [e.data["seq"] for e in events if e.kind == "delta"] == [0, 1, 2, 3, 4]
    assert [e.text for e in events[:2]] == ["", "The incident"]
    first = run.bundle["attempts"]["attempts"][0]["stream"]
    assert first["events"] == 0 and "last_sequence" not in first
    check_sealed(run, events)


def test_a_stream_without_any_text_is_delivered_at_its_end() -> None:
    items: List[Any] = [{"seq": 0, "id": "resp_a"}, {"seq": 1, "id": "resp_a", "end": True}]
    run, events, provider, error = drive("tentative", items, reader=Seq())
    assert error is None
    assert rows(events) == [("delta", "tentative", 1, 1), ("delta", "tentative", 1, 2), ("commit", "committed", 1, 3)]
    check_sealed(run, events)


def test_break_without_close_closes_the_stream_when_the_iterator_is_dropped() -> None:
    clock = FakeClock()
    provider = Provider(clock, list(TEXT) + ["more"] * 10)
    run = retryledger.run_stream(policy("tentative"), provider, KEY, clock=clock, sleep=clock.sleep)
    events: List[StreamEvent] = []
    for ev in run:
        events.append(ev)
        if len(events) == 3:
            break
    # The for loop dropped its iterator: the provider stream is closed, the run sealed.
    assert provider.closed == [True]
    assert run.terminal == "stop_indeterminate"
    assert logged(run) == rows(events) + [("invalidate", "invalidated", 1, 4)]
    assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"
