"""retryledger.openai's streams against the loopback SSE server with the real
openai clients: chat completions and the Responses API (with resumption),
sync and async. In every case the consumer's events are the sealed bundle's
stream_events and the bundle replays verified."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Tuple

import openai
import pytest

import retryledger
import retryledger.openai as rl_openai
from retryledger import StreamEvent

from conftest import KEY, make_policy
from sse_loopback import DEFAULT_TEXT, SSEServer

PRIMARY, FALLBACK = "private-primary", "external-fallback"
CHAT: Dict[str, Any] = {"model": "gpt-fake", "messages": [{"role": "user", "content": "summarize INC-4471"}]}
RESPONSE: Dict[str, Any] = {"model": "gpt-fake", "input": "summarize INC-4471"}

Row = Tuple[str, str, int, int]


def policy(mode: str, **stream: Any) -> Dict[str, Any]:
    contract: Dict[str, Any] = {"mode": mode, "max_response_bytes": 65536}
    contract.update(stream)
    return make_policy(stream=contract)


def clients(server: SSEServer) -> Dict[str, openai.OpenAI]:
    return {r: openai.OpenAI(base_url=server.url(r), api_key="k", max_retries=0) for r in (PRIMARY, FALLBACK)}


def async_clients(server: SSEServer) -> Dict[str, openai.AsyncOpenAI]:
    return {r: openai.AsyncOpenAI(base_url=server.url(r), api_key="k", max_retries=0) for r in (PRIMARY, FALLBACK)}


def rows(events: List[StreamEvent]) -> List[Row]:
    return [(e.kind, e.status, e.attempt, e.sequence) for e in events]


def check_sealed(run: Any, events: List[StreamEvent]) -> None:
    assert rows(events) == [
        (e["kind"], e["status"], e["attempt_ordinal"], e["sequence"]) for e in run.bundle["stream_events"]
    ]
    assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"


def consume(run: Any) -> Tuple[List[StreamEvent], Optional[retryledger.RunStoppedError]]:
    events: List[StreamEvent] = []
    try:
        for ev in run:
            events.append(ev)
    except retryledger.RunStoppedError as exc:
        return events, exc
    return events, None


def text_of(events: List[StreamEvent], attempt: int) -> str:
    return "".join(e.text or "" for e in events if e.kind == "delta" and e.attempt == attempt)


def keys(server: SSEServer) -> List[Optional[str]]:
    return [r.idempotency_key for r in server.requests]


# ---- chat completions ------------------------------------------------------------


def test_chat_cut_before_output_retries_invisibly() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 0}, {}]}) as server:
        run = rl_openai.stream_chat_completions(policy("tentative"), clients(server), CHAT, KEY)
        events, error = consume(run)
    assert error is None and run.terminal == "completed"
    assert {e.attempt for e in events} == {2}  # nothing of the first attempt, not even an invalidate
    assert [e.kind for e in events][-1] == "commit" and "invalidate" not in [e.kind for e in events]
    assert text_of(events, 2) == DEFAULT_TEXT
    assert server.count(PRIMARY) == 2 and keys(server) == [KEY, KEY]
    assert all(r.body["stream"] is True and r.body["stream_options"] == {"include_usage": True} for r in server.requests)
    first = run.bundle["attempts"]["attempts"][0]
    assert first["outcome"] == {"class": "retryable", "kind": "unavailable"} and first["stream"]["events"] == 0
    check_sealed(run, events)


def test_chat_cut_after_output_under_tentative_invalidates_first() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:
        run = rl_openai.stream_chat_completions(policy("tentative"), clients(server), CHAT, KEY)
        events, error = consume(run)
    assert error is None and run.terminal == "completed"
    kinds = [(e.kind, e.attempt) for e in events]
    cut = kinds.index(("invalidate", 1))
    assert all(a == 1 for _, a in kinds[:cut]) and all(a == 2 for _, a in kinds[cut + 1 :])
    assert text_of(events, 1) == "Hello world"  # two of five pieces reached the consumer, then were voided
    assert text_of(events, 2) == DEFAULT_TEXT
    assert kinds[-1] == ("commit", 2)
    assert server.count() == 2 and keys(server) == [KEY, KEY]
    last = run.bundle["attempts"]["attempts"][1]["stream"]
    assert last["terminal_event"] is True and last["usage_event"] is True
    check_sealed(run, events)


def test_chat_restart_stops_indeterminate_after_the_invalidate() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:
        run = rl_openai.stream_chat_completions(policy("restart"), clients(server), CHAT, KEY)
        events, error = consume(run)
    assert error is not None and error.code == "stop_indeterminate"
    assert events[-1].kind == "invalidate" and {e.attempt for e in events} == {1}
    assert server.count() == 1
    check_sealed(run, events)


def test_chat_malformed_event_is_a_violation() -> None:
    with SSEServer({PRIMARY: [{"malformed_after": 1}, {}]}) as server:
        run = rl_openai.stream_chat_completions(policy("tentative"), clients(server), CHAT, KEY)
        events, error = consume(run)
    assert error is not None and error.code == "stop_non_retryable"
    assert run.bundle["attempts"]["attempts"][0]["stream"]["violation"] == "malformed_event"
    assert events[-1].kind == "invalidate" and server.count() == 1
    check_sealed(run, events)


def test_chat_stall_hits_the_read_timeout_and_retries() -> None:
    with SSEServer({PRIMARY: [{"stall_after": 1, "stall_s": 2.0}, {}]}) as server:
        run = rl_openai.stream_chat_completions(
            policy("tentative", first_byte_timeout_ms=300, idle_timeout_ms=300), clients(server), CHAT, KEY
        )
        events, error = consume(run)
    assert error is None and run.terminal == "completed"
    first = run.bundle["attempts"]["attempts"][0]
    assert first["outcome"] == {"class": "retryable", "kind": "timeout_before_response"}
    assert [e.kind for e in events if e.attempt == 1][-1] == "invalidate"
    assert text_of(events, 2) == DEFAULT_TEXT
    check_sealed(run, events)


def test_clients_that_retry_are_refused() -> None:
    with SSEServer({PRIMARY: [{}]}) as server:
        retrying = {r: openai.OpenAI(base_url=server.url(r), api_key="k") for r in (PRIMARY, FALLBACK)}
        with pytest.raises(retryledger.PolicyError) as info:
            rl_openai.stream_chat_completions(policy("tentative"), retrying, CHAT, KEY)
        assert server.count() == 0
    assert info.value.code == "retry_owner_not_harness"


def test_async_chat_cut_after_output_under_tentative() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 3}, {}]}) as server:

        async def main() -> Tuple[Any, List[StreamEvent]]:
            run = rl_openai.stream_chat_completions_async(policy("tentative"), async_clients(server), CHAT, KEY)
            return run, [ev async for ev in run]

        run, events = asyncio.run(main())
    assert run.terminal == "completed"
    kinds = [(e.kind, e.attempt) for e in events]
    cut = kinds.index(("invalidate", 1))
    assert all(a == 2 for _, a in kinds[cut + 1 :]) and kinds[-1] == ("commit", 2)
    assert text_of(events, 2) == DEFAULT_TEXT
    assert keys(server) == [KEY, KEY]
    check_sealed(run, events)


# ---- the Responses API ---------------------------------------------------------------


def test_responses_continuation_resumes_without_duplicate_or_gap() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:
        run = rl_openai.stream_responses(policy("continuation"), clients(server), RESPONSE, KEY)
        events, error = consume(run)
        requests = list(server.requests)
    assert error is None and run.terminal == "completed"
    deltas = [e for e in events if e.kind == "delta"]
    numbers = [e.data.sequence_number for e in deltas]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # no duplicate, no gap
    assert numbers[0] == 0 and deltas[-1].data.type == "response.completed"
    assert "".join(e.text or "" for e in deltas) == DEFAULT_TEXT
    assert [e.kind for e in events] == ["delta"] * len(deltas) + ["commit"]
    # One POST, then one GET resuming after the last event the consumer received.
    assert [r.method for r in requests] == ["POST", "GET"]
    assert requests[0].body["stream"] is True and requests[0].body["background"] is True
    resumed_after = max(e.data.sequence_number for e in deltas if e.attempt == 1)
    rid = deltas[0].data.response.id  # response.created
    assert requests[1].path == f"/{PRIMARY}/responses/{rid}"
    assert requests[1].query == {"stream": "true", "starting_after": str(resumed_after)}
    assert keys(server) == [KEY, KEY]
    second = run.bundle["attempts"]["attempts"][1]["stream"]
    assert second["continues_ordinal"] == 1 and second["starting_after"] == resumed_after
    assert second["response_id"] == rid and second["terminal_event"] is True
    check_sealed(run, events)


def test_responses_cut_after_output_under_tentative_starts_a_new_response() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:
        run = rl_openai.stream_responses(policy("tentative"), clients(server), RESPONSE, KEY)
        events, error = consume(run)
        methods = [r.method for r in server.requests]
    assert error is None and methods == ["POST", "POST"]
    kinds = [(e.kind, e.attempt) for e in events]
    cut = kinds.index(("invalidate", 1))
    assert all(a == 2 for _, a in kinds[cut + 1 :])
    assert text_of(events, 2) == DEFAULT_TEXT
    check_sealed(run, events)


def test_responses_sequence_back_is_a_violation() -> None:
    with SSEServer({PRIMARY: [{"sequence_back_after": 2}, {}]}) as server:
        run = rl_openai.stream_responses(policy("tentative"), clients(server), RESPONSE, KEY)
        events, error = consume(run)
    assert error is not None and error.code == "stop_non_retryable"
    assert run.bundle["attempts"]["attempts"][0]["stream"]["violation"] == "sequence_back"
    assert events[-1].kind == "invalidate"
    check_sealed(run, events)


def test_async_responses_continuation() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 3}, {}]}) as server:

        async def main() -> Tuple[Any, List[StreamEvent]]:
            run = rl_openai.stream_responses_async(policy("continuation"), async_clients(server), RESPONSE, KEY)
            return run, [ev async for ev in run]

        run, events = asyncio.run(main())
        methods = [r.method for r in server.requests]
    assert methods == ["POST", "GET"]
    deltas = [e for e in events if e.kind == "delta"]
    numbers = [e.data.sequence_number for e in deltas]
    assert numbers == list(range(0, len(numbers)))
    assert "".join(e.text or "" for e in deltas) == DEFAULT_TEXT
    check_sealed(run, events)


# ---- the options of every driver on the host loop ------------------------------------


class RunClock:
    """A caller's run clock (ms since admission), moved only by its sleeps."""

    def __init__(self, start: int) -> None:
        self.t = start
        self.slept: List[int] = []

    def __call__(self) -> int:
        return self.t

    def sleep(self, ms: float) -> None:
        self.slept.append(int(ms))
        self.t += int(ms)

    async def asleep(self, ms: float) -> None:
        self.sleep(ms)


def test_now_is_the_run_clock_of_a_stream() -> None:
    clock = RunClock(1_000)
    with SSEServer({PRIMARY: [{"cut_after": 3}, {}]}) as server:
        run = rl_openai.stream_chat_completions(
            policy("tentative"), clients(server), CHAT, KEY, now=clock, sleep=clock.sleep
        )
        events, error = consume(run)
    assert error is None and run.terminal == "completed"
    first, second = run.bundle["attempts"]["attempts"]
    # The run began 1000 ms after admission: its clock is the caller's, never re-zeroed.
    assert first["started_at_ms"] == 1_000 and first["completed_at_ms"] == 1_000
    assert clock.slept and second["started_at_ms"] == 1_000 + sum(clock.slept)
    assert text_of(events, 2) == DEFAULT_TEXT
    check_sealed(run, events)


def test_now_is_the_run_clock_of_an_async_stream() -> None:
    clock = RunClock(2_500)
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:

        async def main() -> Tuple[Any, List[StreamEvent]]:
            run = rl_openai.stream_chat_completions_async(
                policy("tentative"), async_clients(server), CHAT, KEY, now=clock, sleep=clock.asleep
            )
            return run, [ev async for ev in run]

        run, events = asyncio.run(main())
    assert run.terminal == "completed"
    first, second = run.bundle["attempts"]["attempts"]
    assert first["started_at_ms"] == 2_500
    assert second["started_at_ms"] == 2_500 + sum(clock.slept) > 2_500
    check_sealed(run, events)


def test_the_openai_stream_takes_the_hooks() -> None:
    clock = RunClock(0)
    log: List[Tuple[str, Any]] = []
    with SSEServer({PRIMARY: [{"cut_after": 3}, {}]}) as server:
        run = rl_openai.stream_chat_completions(
            policy("tentative"), clients(server), CHAT, KEY, now=clock, sleep=clock.sleep,
            on_decision=lambda d: log.append(("decision", d)),
            on_sleep=lambda s: log.append(("sleep", s)),
            on_attempt=lambda a, j: log.append(("attempt", j.stream)),
            on_terminal=lambda r: log.append(("terminal", r["terminal"])),
        )
        events, error = consume(run)
    assert error is None
    assert [k for k, _ in log] == ["decision", "attempt", "decision", "sleep", "attempt", "decision", "terminal"]
    assert [v for k, v in log if k == "attempt"] == ["invalidate", "commit"]
    [sleep] = [v for k, v in log if k == "sleep"]
    assert sleep["ordinal"] == 2 and sleep["sleep_ms"] == sum(clock.slept)
    assert log[-1] == ("terminal", "completed")
    check_sealed(run, events)
