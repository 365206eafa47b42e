"""retryledger.anthropic's streams against the loopback SSE server with the
real anthropic clients (messages.create(stream=True)), sync and async. In
every case the consumer's events are the sealed bundle's stream_events and
the bundle replays verified."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Tuple

import anthropic
import pytest

import retryledger
import retryledger.anthropic as rl_anthropic
from retryledger import StreamEvent

from conftest import KEY, make_policy
from sse_loopback import DEFAULT_TEXT, SSEServer

PRIMARY, FALLBACK = "private-primary", "external-fallback"
PARAMS: Dict[str, Any] = {
    "model": "claude-fake",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "summarize INC-4471"}],
}

Row = Tuple[str, str, int, int]


def policy(mode: str, **stream: Any) -> Dict[str, Any]:
    contract: Dict[str, Any] = {"mode": mode, "max_response_bytes": 65536}
    contract.update(stream)
    return make_policy(stream=contract)


def clients(server: SSEServer) -> Dict[str, anthropic.Anthropic]:
    return {r: anthropic.Anthropic(base_url=server.url(r), api_key="k", max_retries=0) for r in (PRIMARY, FALLBACK)}


def async_clients(server: SSEServer) -> Dict[str, anthropic.AsyncAnthropic]:
    return {r: anthropic.AsyncAnthropic(base_url=server.url(r), api_key="k", max_retries=0) for r in (PRIMARY, FALLBACK)}


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


def test_clean_message_stream_commits_with_usage_and_id() -> None:
    with SSEServer({PRIMARY: [{"input_tokens": 21}]}) as server:
        run = rl_anthropic.stream_messages(policy("tentative"), clients(server), PARAMS, KEY)
        events, error = consume(run)
        request = server.requests[0]
    assert error is None and run.terminal == "completed"
    assert text_of(events, 1) == DEFAULT_TEXT
    types = [e.data.type for e in events if e.kind == "delta"]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert events[-1].kind == "commit"
    stream = run.bundle["attempts"]["attempts"][0]["stream"]
    assert stream["terminal_event"] is True and stream["usage_event"] is True
    assert stream["response_id"] == events[0].data.message.id
    assert request.idempotency_key == KEY and request.body["stream"] is True
    check_sealed(run, events)


def test_cut_before_output_retries_invisibly() -> None:
    # message_start, ping and content_block_start arrive, then the cut: no text yet.
    with SSEServer({PRIMARY: [{"cut_after": 0}, {}]}) as server:
        run = rl_anthropic.stream_messages(policy("tentative"), clients(server), PARAMS, KEY)
        events, error = consume(run)
        keys = [r.idempotency_key for r in server.requests]
    assert error is None and run.terminal == "completed"
    assert {e.attempt for e in events} == {2} and "invalidate" not in [e.kind for e in events]
    assert text_of(events, 2) == DEFAULT_TEXT
    assert keys == [KEY, KEY]
    assert run.bundle["attempts"]["attempts"][0]["stream"]["events"] == 0
    check_sealed(run, events)


def test_cut_after_output_under_tentative_invalidates_first() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:
        run = rl_anthropic.stream_messages(policy("tentative"), clients(server), PARAMS, KEY)
        events, error = consume(run)
        keys = [r.idempotency_key for r in server.requests]
    assert error is None and run.terminal == "completed"
    kinds = [(e.kind, e.attempt) for e in events]
    cut = kinds.index(("invalidate", 1))
    assert all(a == 1 for _, a in kinds[:cut]) and all(a == 2 for _, a in kinds[cut + 1 :])
    assert text_of(events, 1) == "Hello world"
    assert text_of(events, 2) == DEFAULT_TEXT and kinds[-1] == ("commit", 2)
    assert keys == [KEY, KEY]
    check_sealed(run, events)


def test_restart_stops_indeterminate_after_the_invalidate() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:
        run = rl_anthropic.stream_messages(policy("restart"), clients(server), PARAMS, KEY)
        events, error = consume(run)
        count = server.count()
    assert error is not None and error.code == "stop_indeterminate"
    assert events[-1].kind == "invalidate" and count == 1
    check_sealed(run, events)


def test_continuation_without_sequence_numbers_starts_over_after_an_invalidate() -> None:
    # Message streams carry no sequence numbers: nothing to resume after.
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:
        run = rl_anthropic.stream_messages(policy("continuation"), clients(server), PARAMS, KEY)
        events, error = consume(run)
    assert error is None
    assert [e.kind for e in events].count("invalidate") == 1
    assert text_of(events, 2) == DEFAULT_TEXT
    check_sealed(run, events)


def test_buffer_delivers_only_the_successful_attempt() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 3}, {}]}) as server:
        run = rl_anthropic.stream_messages(policy("buffer"), clients(server), PARAMS, KEY)
        events, error = consume(run)
    assert error is None
    assert {e.attempt for e in events} == {2} and all(e.status == "committed" for e in events)
    assert text_of(events, 2) == DEFAULT_TEXT
    check_sealed(run, events)


def test_clients_that_retry_are_refused() -> None:
    retrying = {r: anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="k") for r in (PRIMARY, FALLBACK)}
    with pytest.raises(retryledger.PolicyError):
        rl_anthropic.stream_messages(policy("tentative"), retrying, PARAMS, KEY)


def test_async_cut_after_output_under_tentative() -> None:
    with SSEServer({PRIMARY: [{"cut_after": 2}, {}]}) as server:

        async def main() -> Tuple[Any, List[StreamEvent]]:
            run = rl_anthropic.stream_messages_async(policy("tentative"), async_clients(server), PARAMS, KEY)
            return run, [ev async for ev in run]

        run, events = asyncio.run(main())
        keys = [r.idempotency_key for r in server.requests]
    kinds = [(e.kind, e.attempt) for e in events]
    cut = kinds.index(("invalidate", 1))
    assert all(a == 2 for _, a in kinds[cut + 1 :]) and kinds[-1] == ("commit", 2)
    assert text_of(events, 2) == DEFAULT_TEXT and keys == [KEY, KEY]
    check_sealed(run, events)
