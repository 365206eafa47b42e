"""A tentative stream cut after its first events on one provider and
completed on another: the consumer sees the first provider's events, one
``invalidate``, then the next provider's events in its own wire format; the
cut attempt's usage is unknown (none recorded, its reservation charged)
while the completed attempt's usage is priced."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Iterator, List

import pytest

import retryledger
from retryledger import providers
from retryledger.testing import FakeClock

from provider_loopback import ProviderServer
from test_providers import KEY, REQUEST, async_clients, clients, spec

STREAM = {"mode": "tentative", "max_response_bytes": 1048576, "first_byte_timeout_ms": 10000, "idle_timeout_ms": 5000}


def chat_chunk(delta: Dict[str, Any], finish: Any = None, usage: Any = None) -> Dict[str, Any]:
    return {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4.1-2025-04-14",
        "choices": [] if usage is not None else [{"index": 0, "delta": delta, "finish_reason": finish}],
        **({"usage": usage} if usage is not None else {}),
    }


OPENAI_EVENTS: List[Any] = [
    chat_chunk({"role": "assistant", "content": ""}),
    chat_chunk({"content": "The migration "}),
    chat_chunk({"content": "timed "}),
    chat_chunk({"content": "out."}, finish="stop"),
    chat_chunk({}, usage={"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26}),
    "[DONE]",
]

ANTHROPIC_EVENTS: List[Any] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_s1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 21, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Deploy 981: "}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "the migration timed out."}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
]


def gemini_chunk(text: str, finish: bool = False) -> Dict[str, Any]:
    chunk: Dict[str, Any] = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}],
        "modelVersion": "gemini-2.5-pro-preview-06-05",
        "responseId": "resp-g-s1",
    }
    if finish:
        chunk["candidates"][0]["finishReason"] = "STOP"
        chunk["usageMetadata"] = {"promptTokenCount": 21, "candidatesTokenCount": 7, "totalTokenCount": 28}
    return chunk


GOOGLE_EVENTS = [gemini_chunk("A migration "), gemini_chunk("timed out.", finish=True)]


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ProviderServer] = []

    def start(scripts: Dict[str, List[Dict[str, Any]]]) -> ProviderServer:
        servers.append(ProviderServer(scripts).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def prices(document: Dict[str, Any]) -> Dict[str, Any]:
    policy = retryledger.build_policy(REQUEST, document)
    return {
        "schema": "retryledger.price_schedule.v1",
        "cost_unit": "micro_usd",
        "releases": [
            {"route_release_sha256": r["route_release_sha256"], "prices_per_million": {"input": 1000000, "output": 2000000, "cached_input": 100000, "reasoning": 2000000}}
            for r in policy.document["routes"]
        ],
    }


def test_a_stream_cut_on_openai_completes_on_anthropic(serve: Any) -> None:
    server = serve({"openai": [{"sse": OPENAI_EVENTS, "cut_after": 3}], "anthropic": [{"sse": ANTHROPIC_EVENTS}]})
    document = spec(["openai", "anthropic"], attempts={"openai": 1, "anthropic": 1}, stream=STREAM)
    clock = FakeClock()
    run = providers.stream(REQUEST, document, clients(server), KEY, clock=clock, sleep=clock.sleep, price_schedule=prices(document))
    events = list(run)
    text = [(e.attempt, e.text) for e in events if e.kind == "delta" and e.text]
    assert text == [
        (1, "The migration "),
        (1, "timed "),
        (2, "Deploy 981: "),
        (2, "the migration timed out."),
    ]
    # One invalidate, after the cut attempt's events and before any of the next provider's.
    assert [e.kind for e in events].count("invalidate") == 1
    cut = [i for i, e in enumerate(events) if e.kind == "invalidate"][0]
    assert all(e.attempt == 1 for e in events[:cut]) and all(e.attempt == 2 for e in events[cut + 1 :])
    assert events[cut].attempt == 1 and events[-1].kind == "commit"
    # The next provider's events are its own wire format.
    assert {type(e.data).__module__.split(".")[0] for e in events[cut + 1 :] if e.kind == "delta"} == {"anthropic"}
    # Each server saw the lowered body, plus what streaming asks for.
    promised = {r["route_id"]: r["lowered"]["body"] for r in retryledger.lower_routes(REQUEST, document)}
    assert server.bodies("openai") == [{**promised["openai"], "stream": True, "stream_options": {"include_usage": True}}]
    assert server.bodies("anthropic") == [{**promised["anthropic"], "stream": True}]
    # Usage: the cut attempt's is unknown (no usage, no usage event, the
    # reservation charged); the completed attempt's is priced from its usage.
    attempts = run.bundle["attempts"]["attempts"]
    assert "usage" not in attempts[0] and attempts[0]["stream"]["usage_event"] is False
    assert run.receipt["schedule"][0]["cost"] == 3000
    assert attempts[1]["usage"] == {"input": 21, "output": 9}
    assert run.receipt["schedule"][1]["cost"] == 21 + 18
    assert [e["model"] for e in run.receipt["schedule"]] == [
        {"requested": "gpt-4.1", "served": "gpt-4.1-2025-04-14"},
        {"requested": "claude-sonnet-4-5", "served": "claude-sonnet-4-5-20250929"},
    ]
    assert run.receipt["attempt_count"] == len(server.received) == 2
    assert retryledger.verify_bundle(run.bundle)["kind"] == "verified"


def test_a_stream_fails_over_openai_anthropic_google(serve: Any) -> None:
    server = serve(
        {
            "openai": [{"sse": OPENAI_EVENTS, "cut_after": 3}],
            "anthropic": [{"sse": ANTHROPIC_EVENTS, "cut_after": 4}],
            "google": [{"sse": GOOGLE_EVENTS}],
        }
    )
    document = spec(["openai", "anthropic", "google"], attempts={"openai": 1, "anthropic": 1, "google": 1}, stream=STREAM)
    clock = FakeClock()
    run = providers.stream(REQUEST, document, clients(server), KEY, clock=clock, sleep=clock.sleep)
    events = list(run)
    sequence = [e.kind for e in events if e.kind != "delta" or e.text]
    assert sequence == ["delta", "delta", "invalidate", "delta", "delta", "invalidate", "delta", "delta", "commit"]
    assert "".join(e.text or "" for e in events if e.attempt == 3 and e.kind == "delta") == "A migration timed out."
    assert [r.path for r in server.received] == [
        "/openai/chat/completions",
        "/anthropic/v1/messages",
        "/google/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
    ]
    promised = {r["route_id"]: r["lowered"]["body"] for r in retryledger.lower_routes(REQUEST, document)}
    assert server.bodies("google") == [promised["google"]]
    assert run.receipt["schedule"][-1]["model"] == {"requested": "gemini-2.5-pro", "served": "gemini-2.5-pro-preview-06-05"}
    assert run.receipt["attempt_count"] == 3


def test_the_async_stream_fails_over_the_same_way(serve: Any) -> None:
    server = serve({"openai": [{"sse": OPENAI_EVENTS, "cut_after": 3}], "google": [{"sse": GOOGLE_EVENTS}]})
    document = spec(["openai", "google"], attempts={"openai": 1, "google": 1}, stream=STREAM)
    clock = FakeClock()

    async def consume() -> List[retryledger.StreamEvent]:
        given = async_clients(server)
        try:
            run = providers.stream_async(REQUEST, document, given, KEY, clock=clock, sleep=clock.async_sleep)
            return [e async for e in run]
        finally:
            await given["openai"].close()
            await given["anthropic"].close()
            await given["google"].aio.aclose()

    events = asyncio.run(consume())
    assert [(e.kind, e.attempt) for e in events if e.kind != "delta" or e.text] == [
        ("delta", 1),
        ("delta", 1),
        ("invalidate", 1),
        ("delta", 2),
        ("delta", 2),
        ("commit", 2),
    ]
    promised = {r["route_id"]: r["lowered"]["body"] for r in retryledger.lower_routes(REQUEST, document)}
    assert server.bodies("google") == [promised["google"]]


def responses_event(kind: str, seq: int, **fields: Any) -> Dict[str, Any]:
    return {"type": kind, "sequence_number": seq, **fields}


def response_object(status: str, usage: bool) -> Dict[str, Any]:
    body: Dict[str, Any] = {
        "id": "resp_s1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-4.1-2025-04-14",
        "status": status,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    if usage:
        body["usage"] = {
            "input_tokens": 21,
            "output_tokens": 4,
            "total_tokens": 25,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    return body


RESPONSES_EVENTS = [
    responses_event("response.created", 0, response=response_object("in_progress", False)),
    responses_event("response.output_text.delta", 1, item_id="msg_1", output_index=0, content_index=0, delta="A migration "),
    responses_event("response.output_text.delta", 2, item_id="msg_1", output_index=0, content_index=0, delta="timed out."),
    responses_event("response.completed", 3, response=response_object("completed", True)),
]


def test_a_responses_stream_names_its_served_model_from_response_created(serve: Any) -> None:
    server = serve({"openai": [{"sse": RESPONSES_EVENTS}]})
    document = spec(["openai"], attempts={"openai": 1}, stream=STREAM)
    document["routes"][0]["release"]["lowering"]["api"] = "openai.responses"
    run = providers.stream(REQUEST, document, clients(server), KEY)
    text = "".join(e.text or "" for e in run if e.kind == "delta")
    assert text == "A migration timed out."
    [lowered] = retryledger.lower_routes(REQUEST, document)
    assert server.bodies("openai") == [{**lowered["lowered"]["body"], "stream": True}]
    assert server.received[0].path == "/openai/responses"
    assert run.receipt["schedule"][0]["model"] == {"requested": "gpt-4.1", "served": "gpt-4.1-2025-04-14"}
    assert run.bundle["attempts"]["attempts"][0]["stream"]["terminal_event"] is True
