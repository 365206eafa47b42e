"""Every wire's lowered body reaches its server as the lowering wrote it when
sent through the real SDK: a conversation with an image, a tool call and its
result, tools, JSON Schema output, a reasoning budget, stop sequences and
sampling, for ``openai`` chat completions and responses, ``anthropic``
messages and ``google`` generateContent (sync and async clients)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, Dict, Iterator, List

import pytest

import retryledger
from retryledger import providers

from provider_loopback import ProviderServer
from test_providers import GEMINI_OK, KEY, clients, run_async_closed, spec

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

RICH: Dict[str, Any] = {
    "schema": "retryledger.request.v1",
    "operation": "chat",
    "system": "You answer incident questions briefly.",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What does this dashboard show?"},
                {"type": "image", "media_type": "image/png", "data": PNG},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_call", "id": "call_a1", "name": "lookup_deploy", "arguments": {"at": "02:00"}}],
        },
        {"role": "tool", "content": [{"type": "tool_result", "tool_call_id": "call_a1", "content": "deploy 981: migration timed out"}]},
    ],
    "tools": [
        {
            "name": "lookup_deploy",
            "description": "Find a deploy by time.",
            "parameters": {"type": "object", "properties": {"at": {"type": "string"}}, "required": ["at"]},
        }
    ],
    "response_format": {
        "type": "json_schema",
        "name": "incident",
        "schema": {"type": "object", "properties": {"cause": {"type": "string"}}, "required": ["cause"]},
    },
    "max_output_tokens": 4096,
    "reasoning": {"budget_tokens": 2048},
    "sampling": {"temperature": 0.5, "top_p": 0.9},
    "seed": 11,
}
WITH_STOP: Dict[str, Any] = {**RICH, "stop": ["\n\nEND"]}

CHAT_OK: Dict[str, Any] = {
    "status": 200,
    "body": {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4.1-2025-04-14",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"cause\": \"migration\"}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 90, "completion_tokens": 8, "total_tokens": 98},
    },
}
RESPONSES_OK: Dict[str, Any] = {
    "status": 200,
    "body": {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-4.1-2025-04-14",
        "status": "completed",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "{\"cause\": \"migration\"}", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 90,
            "output_tokens": 8,
            "total_tokens": 98,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    },
}
MESSAGE_OK: Dict[str, Any] = {
    "status": 200,
    "body": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "{\"cause\": \"migration\"}"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 90, "output_tokens": 8},
    },
}

CASES = {
    # route id, wire, the server's answer, the served model
    "chat": ("openai", "openai.chat_completions", CHAT_OK, "gpt-4.1-2025-04-14"),
    "responses": ("openai", "openai.responses", RESPONSES_OK, "gpt-4.1-2025-04-14"),
    "anthropic": ("anthropic", "anthropic.messages", MESSAGE_OK, "claude-sonnet-4-5-20250929"),
    "google": ("google", "google.generate_content", GEMINI_OK, "gemini-2.5-pro-preview-06-05"),
}


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ProviderServer] = []

    def start(scripts: Dict[str, List[Dict[str, Any]]]) -> ProviderServer:
        servers.append(ProviderServer(scripts).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def one_route(provider: str, api: str) -> Dict[str, Any]:
    document = spec([provider])
    document["requirements"]["input_modalities"] = ["text", "image"]
    route = document["routes"][0]
    route["capabilities"]["input_modalities"] = ["text", "image"]
    route["release"]["lowering"]["api"] = api
    return document


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("is_async", [False, True])
def test_the_sdk_sends_the_lowered_body(serve: Any, case: str, is_async: bool) -> None:
    provider, api, answer, served = CASES[case]
    request = RICH if api == "openai.responses" else WITH_STOP  # responses has no stop sequences
    server = serve({provider: [answer]})
    document = one_route(provider, api)
    [lowered] = retryledger.lower_routes(request, document)
    assert lowered["lowered"]["api"] == api
    if is_async:
        result = asyncio.run(run_async_closed(server, request, document))
    else:
        result = providers.run(request, document, clients(server), KEY)
    [received] = server.received
    assert received.body == lowered["lowered"]["body"]
    assert received.idempotency_key == KEY
    [attempt] = result.bundle["attempts"]["attempts"]
    assert attempt["request_body_sha256"] == lowered["lowered"]["body_sha256"]
    assert attempt["model"] == {"requested": lowered["lowered"]["model"], "served": served}


def test_responses_refuses_stop_sequences_before_any_request(serve: Any) -> None:
    server = serve({"openai": [RESPONSES_OK]})
    document = one_route("openai", "openai.responses")
    with pytest.raises(retryledger.PolicyError) as info:
        providers.run(WITH_STOP, document, clients(server), KEY)
    assert info.value.code == "no_capable_route"
    assert retryledger.route_capabilities(WITH_STOP, document)["routes"][0]["code"] == "capability_missing"
    assert server.received == []


def test_a_price_schedule_charges_each_sdk_s_usage(serve: Any) -> None:
    server = serve({"anthropic": [MESSAGE_OK]})
    document = one_route("anthropic", "anthropic.messages")
    policy = retryledger.build_policy(WITH_STOP, document)
    schedule = {
        "schema": "retryledger.price_schedule.v1",
        "cost_unit": "micro_usd",
        "releases": [
            {"route_release_sha256": policy.document["routes"][0]["route_release_sha256"], "prices_per_million": {"input": 3_000_000, "output": 15_000_000}}
        ],
    }
    result = providers.run(WITH_STOP, copy.deepcopy(document), clients(server), KEY, price_schedule=schedule)
    [attempt] = result.bundle["attempts"]["attempts"]
    assert attempt["usage"] == {"input": 90, "output": 8}
    assert attempt["cost"] == 90 * 3 + 8 * 15
