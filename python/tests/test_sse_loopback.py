"""The streaming fake providers (sse_loopback.py) against the real openai and
anthropic clients: full streams in each dialect, Responses resumption, and what
each client raises for each fault.

What the clients do with the faults (openai 3.51, anthropic 2.16, on httpx2):

============  ===================================  =======================================
fault         openai (chat and responses)          anthropic (create(stream=True), stream())
============  ===================================  =======================================
cut_after     openai.APIConnectionError             httpx2.RemoteProtocolError, unwrapped
              (cause httpx2.RemoteProtocolError)
error_after   chat: openai.APIError;                anthropic.APIStatusError (status 200,
              responses: no raise, an "error"      body the error event), not OverloadedError
              event (ResponseErrorEvent) is yielded
no_terminal   no raise, iteration ends              no raise; stream() even gives a final message
malformed     json.JSONDecodeError                  json.JSONDecodeError
status 429    openai.RateLimitError                 anthropic.RateLimitError
============  ===================================  =======================================
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Dict, List, Optional

import anthropic
import httpx2
import openai
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)

from sse_loopback import SSEServer, split_text

TEXT = "Hello world from the primary"
MESSAGES: List[ChatCompletionMessageParam] = [{"role": "user", "content": "summarize INC-4471"}]
PROMPT: List[MessageParam] = [{"role": "user", "content": "summarize INC-4471"}]


def oai(server: SSEServer, route: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url(route), api_key="k", max_retries=0)


def claude(server: SSEServer, route: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url(route), api_key="k", max_retries=0)


def chat_texts(server: SSEServer, route: str, key: Optional[str] = None) -> List[str]:
    headers = {"Idempotency-Key": key} if key else None
    stream = oai(server, route).chat.completions.create(model="gpt-fake", messages=MESSAGES, stream=True, extra_headers=headers)
    return [c.choices[0].delta.content or "" for c in stream if c.choices]


def response_events(server: SSEServer, route: str) -> List[ResponseStreamEvent]:
    return list(oai(server, route).responses.create(model="gpt-fake", input="hi", stream=True))


def anthropic_events(server: SSEServer, route: str) -> List[Any]:
    return list(claude(server, route).messages.create(model="claude-fake", max_tokens=64, messages=PROMPT, stream=True))


def deltas(events: List[ResponseStreamEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))


def test_split_text_keeps_the_text() -> None:
    for chunks in range(1, 12):
        pieces = split_text(TEXT, chunks)
        assert "".join(pieces) == TEXT
        assert len(pieces) == min(chunks, len(TEXT))
        assert all(pieces)


def test_chat_completions_stream_with_usage_is_read_to_the_end() -> None:
    with SSEServer({"p": [{"text": TEXT, "chunks": 5}]}) as server:
        stream = oai(server, "p").chat.completions.create(
            model="gpt-fake", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    assert [c.object for c in chunks] == ["chat.completion.chunk"] * 8
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.total_tokens == 17
    assert len({c.id for c in chunks}) == 1
    assert server.count("p") == 1
    seen = server.requests[0]
    assert (seen.method, seen.path, seen.body["stream"]) == ("POST", "/p/chat/completions", True)


def test_async_chat_completions_stream() -> None:
    async def run(server: SSEServer) -> str:
        client = openai.AsyncOpenAI(base_url=server.url("p"), api_key="k", max_retries=0)
        stream = await client.chat.completions.create(model="gpt-fake", messages=MESSAGES, stream=True)
        text = ""
        async for chunk in stream:
            text += chunk.choices[0].delta.content or ""
        await client.close()
        return text

    with SSEServer({"p": [{"text": "one two three", "chunks": 3}]}) as server:
        assert asyncio.run(run(server)) == "one two three"


def test_responses_stream_sequence_and_completed_usage() -> None:
    with SSEServer({"p": [{"text": TEXT, "chunks": 5}]}) as server:
        events = response_events(server, "p")
    assert [e.sequence_number for e in events] == list(range(13))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 5,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert deltas(events) == TEXT
    first, last = events[0], events[-1]
    assert isinstance(first, ResponseCreatedEvent) and isinstance(last, ResponseCompletedEvent)
    assert first.response.id == last.response.id == "resp_p_0"
    assert last.response.output_text == TEXT
    assert last.response.usage is not None
    assert (last.response.usage.input_tokens, last.response.usage.output_tokens, last.response.usage.total_tokens) == (12, 5, 17)


def test_responses_resume_with_starting_after_replays_the_rest() -> None:
    with SSEServer({"p": [{"text": TEXT, "chunks": 5, "cut_after": 2}, {}]}) as server:
        client = oai(server, "p")
        got: List[ResponseStreamEvent] = []
        with pytest.raises(openai.APIConnectionError):
            for event in client.responses.create(model="gpt-fake", input="hi", stream=True):
                got.append(event)
        assert [e.sequence_number for e in got] == list(range(6))  # preamble, then two deltas
        rid = got[0].response.id if isinstance(got[0], ResponseCreatedEvent) else ""
        last = got[-1].sequence_number
        rest = list(client.responses.retrieve(rid, stream=True, starting_after=last))
        assert [e.sequence_number for e in rest] == list(range(last + 1, 13))
        assert deltas(got) + deltas(rest) == TEXT
        assert isinstance(rest[-1], ResponseCompletedEvent) and rest[-1].response.id == rid
        resume = server.requests[1]
        assert (resume.method, resume.path) == ("GET", f"/p/responses/{rid}")
        assert resume.query == {"stream": "true", "starting_after": str(last)}
        # Without stream the same id answers the final object.
        assert client.responses.retrieve(rid).output_text == TEXT


def test_anthropic_stream_and_create_stream() -> None:
    with SSEServer({"p": [{"text": TEXT, "chunks": 4}]}) as server:
        with claude(server, "p").messages.stream(model="claude-fake", max_tokens=64, messages=PROMPT) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == TEXT
        assert final.id == "msg_p_0" and final.stop_reason == "end_turn"
        assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 4)
        events = anthropic_events(server, "p")
    # ping is skipped by the client
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == TEXT
    assert server.requests[0].path == "/p/v1/messages"


def test_cut_after_raises_api_connection_error_in_openai() -> None:
    with SSEServer({"c": [{"cut_after": 2}]}) as server:
        texts: List[str] = []
        with pytest.raises(openai.APIConnectionError) as caught:
            for chunk in oai(server, "c").chat.completions.create(model="m", messages=MESSAGES, stream=True):
                texts.append(chunk.choices[0].delta.content or "")
        assert isinstance(caught.value.__cause__, httpx2.RemoteProtocolError)
        assert texts == ["", "Hello", " world"]
        got: List[ResponseStreamEvent] = []
        with pytest.raises(openai.APIConnectionError):
            for event in oai(server, "c").responses.create(model="m", input="x", stream=True):
                got.append(event)
        assert deltas(got) == "Hello world"


def test_cut_after_raises_httpx2_remote_protocol_error_in_anthropic() -> None:
    with SSEServer({"c": [{"cut_after": 1}]}) as server:
        with pytest.raises(httpx2.RemoteProtocolError):
            anthropic_events(server, "c")
        with pytest.raises(httpx2.RemoteProtocolError):
            with claude(server, "c").messages.stream(model="m", max_tokens=5, messages=PROMPT) as stream:
                stream.get_final_message()


def test_cut_reset_is_a_read_error() -> None:
    with SSEServer({"c": [{"cut_after": 1, "cut_reset": True}]}) as server:
        with pytest.raises(openai.APIConnectionError):
            chat_texts(server, "c")
        with pytest.raises(httpx2.TransportError):
            anthropic_events(server, "c")


def test_error_after_in_each_dialect() -> None:
    with SSEServer({"e": [{"error_after": 2, "error_code": "server_error", "error_message": "boom"}]}) as server:
        # chat: openai.APIError from the data frame's "error"
        with pytest.raises(openai.APIError) as chat_error:
            chat_texts(server, "e")
        assert type(chat_error.value) is openai.APIError and chat_error.value.message == "boom"
        # responses: no raise; the error event is yielded and iteration ends
        events = response_events(server, "e")
        assert isinstance(events[-1], ResponseErrorEvent)
        assert (events[-1].code, events[-1].message, events[-1].sequence_number) == ("server_error", "boom", 6)
        assert deltas(events) == "Hello world"
    with SSEServer({"e": [{"error_after": 1}]}) as server:
        # anthropic: APIStatusError (the HTTP status was 200), body the error event
        with pytest.raises(anthropic.APIStatusError) as caught:
            anthropic_events(server, "e")
        assert type(caught.value) is anthropic.APIStatusError
        assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_no_terminal_ends_iteration_without_raising() -> None:
    with SSEServer({"n": [{"no_terminal": True}]}) as server:
        assert "".join(chat_texts(server, "n")) == TEXT  # no [DONE], no raise
        events = response_events(server, "n")
        assert events[-1].type == "response.output_item.done" and len(events) == 12  # no response.completed
        assert anthropic_events(server, "n")[-1].type == "message_delta"  # no message_stop
        with claude(server, "n").messages.stream(model="m", max_tokens=5, messages=PROMPT) as stream:
            assert stream.get_final_message().content[0].type == "text"


def test_end_after_ends_cleanly_mid_stream() -> None:
    with SSEServer({"n": [{"end_after": 2}]}) as server:
        assert chat_texts(server, "n") == ["", "Hello", " world"]
        assert deltas(response_events(server, "n")) == "Hello world"


def test_malformed_after_raises_json_decode_error() -> None:
    with SSEServer({"m": [{"malformed_after": 1}]}) as server:
        with pytest.raises(json.JSONDecodeError):
            chat_texts(server, "m")
        with pytest.raises(json.JSONDecodeError):
            response_events(server, "m")
        with pytest.raises(json.JSONDecodeError):
            anthropic_events(server, "m")


def test_oversize_and_sequence_back() -> None:
    with SSEServer({"o": [{"text": "a b", "chunks": 2, "oversize_after": 1, "oversize_bytes": 100_000}]}) as server:
        texts = chat_texts(server, "o")
        assert [len(t) for t in texts] == [0, 1, 100_000, 2, 0]  # role chunk, deltas, finish chunk
    with SSEServer({"s": [{"sequence_back_after": 2}]}) as server:
        seqs = [e.sequence_number for e in response_events(server, "s")]
        assert seqs[:7] == [0, 1, 2, 3, 4, 5, 4] and seqs[7:] == list(range(7, 13))


def test_stall_after_pauses_then_finishes() -> None:
    with SSEServer({"s": [{"stall_after": 1, "stall_s": 0.3}]}) as server:
        arrivals: List[float] = []
        for chunk in oai(server, "s").chat.completions.create(model="m", messages=MESSAGES, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic())
        assert len(arrivals) == 5
        assert arrivals[1] - arrivals[0] >= 0.25


def test_status_429_raises_rate_limit_error_and_the_log_has_the_key() -> None:
    script: Dict[str, List[Dict[str, Any]]] = {"r": [{"status": 429, "headers": {"retry-after": "1"}}, {"text": "ok"}]}
    with SSEServer(script) as server:
        with pytest.raises(openai.RateLimitError) as caught:
            chat_texts(server, "r", key="key-1")
        assert caught.value.response.headers["retry-after"] == "1"
        assert caught.value.code == "rate_limit_exceeded"
        assert "".join(chat_texts(server, "r")) == "ok"
        assert server.count("r") == 2 and server.requests[0].idempotency_key == "key-1"
        assert server.requests[0].arrived <= server.requests[1].arrived
    with SSEServer({"r": [{"status": 429}]}) as server:
        with pytest.raises(anthropic.RateLimitError) as limited:
            anthropic_events(server, "r")
        assert limited.value.body == {"type": "error", "error": {"type": "rate_limit_error", "message": "fake 429"}}
        with pytest.raises(openai.RateLimitError):
            response_events(server, "r")


def test_the_nth_request_gets_the_nth_reply_and_the_last_repeats() -> None:
    with SSEServer({"p": [{"text": "one"}, {"text": "two"}], "q": [{"text": "other"}]}) as server:
        got = ["".join(chat_texts(server, "p")) for _ in range(3)]
        assert got == ["one", "two", "two"]
        assert "".join(chat_texts(server, "q")) == "other"
        assert (server.count("p"), server.count("q"), server.count()) == (3, 1, 4)
