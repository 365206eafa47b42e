"""One logical request over openai, anthropic and google routes in one call,
each route dispatched through its own real SDK client against a loopback
server speaking that provider's wire format. Each server's received body is
compared with the body the core's lowering promised for its route; the
receipt names the requested and served model of every attempt."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
from typing import Any, Dict, Iterator, List, Optional

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as genai_types

import retryledger
from retryledger import providers
from retryledger.testing import FakeClock

from provider_loopback import ProviderServer

KEY = "idempotency-key: tenant-7/op-summarize/INC-4471"
KEY_SHA256 = hashlib.sha256(KEY.encode()).hexdigest()

REQUEST: Dict[str, Any] = {
    "schema": "retryledger.request.v1",
    "operation": "chat",
    "system": "You answer incident questions briefly.",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "What failed in the 02:00 deploy?"}]}],
    "max_output_tokens": 512,
    "sampling": {"temperature": 0.2, "top_p": 0.95},
    "seed": 7,
}

CAPABILITIES: Dict[str, Any] = {
    "input_modalities": ["text"],
    "max_context_tokens": 128000,
    "max_output_tokens": 2048,
    "max_response_bytes": 1048576,
    "output_modalities": ["text"],
    "refusal": "typed",
    "regions": ["eu-central-1"],
    "release_pin": "exact",
    "retention_days": 30,
    "sampling_controls": ["seed", "temperature"],
    "streaming_events": ["terminal", "usage"],
    "structured_output": "json_schema",
    "tool_calls": "single",
}

MODELS = {
    "openai": ("openai.chat_completions", "gpt-4.1"),
    "anthropic": ("anthropic.messages", "claude-sonnet-4-5"),
    "google": ("google.generate_content", "gemini-2.5-pro"),
}


def release(provider: str) -> Dict[str, Any]:
    api, model = MODELS[provider]
    return {
        "schema": "retryledger.route_release.v1",
        "provider": provider,
        "provider_family": provider,
        "endpoint": f"https://api.{provider}.example/v1",
        "model": model,
        "release_pin": model,
        "lowering": {
            "api": api,
            "context_window_tokens": 200000,
            "max_output_tokens": 8192,
            "supports": ["images", "json_schema", "tools"],
            "thinking_budget_tokens": 16384,
        },
    }


def spec(providers_in_order: List[str], attempts: Optional[Dict[str, int]] = None, **extra: Any) -> Dict[str, Any]:
    """A spec with one route per provider, in priority order; a 2 s cap on
    Retry-After and ``skip_route`` above it (a quota that cannot clear
    within the run moves on to the next route)."""
    document: Dict[str, Any] = {
        "schema": "retryledger.policy_spec.v1",
        "backoff": {"base_ms": 100, "max_ms": 1000, "retry_after_cap_ms": 2000, "retry_after_over_cap": "skip_route"},
        "behavior_class": {"schema": "retryledger.behavior_class.v1", "name": "incident-summary@1"},
        "cost_unit": "micro_usd",
        "deadline_ms": 60000,
        "idempotency_key_sha256": KEY_SHA256,
        "max_data_boundary": "external_provider",
        "max_total_attempts": 6,
        "max_total_cost": 100000,
        "requirements": copy.deepcopy(CAPABILITIES),
        "routes": [
            {
                "route_id": provider,
                "capabilities": copy.deepcopy(CAPABILITIES),
                "data_boundary": "external_provider",
                "max_attempts": (attempts or {}).get(provider, 2),
                "release": release(provider),
                "reserve_cost": 3000,
                "supports_idempotency": True,
            }
            for provider in providers_in_order
        ],
    }
    document.update(extra)
    return document


def clients(server: ProviderServer) -> Dict[str, Any]:
    return {
        "openai": openai.OpenAI(api_key="test", base_url=server.url("openai"), max_retries=0),
        "anthropic": anthropic.Anthropic(api_key="test", base_url=server.url("anthropic"), max_retries=0),
        "google": genai.Client(
            api_key="test", http_options=genai_types.HttpOptions(base_url=server.url("google"), api_version="v1beta")
        ),
    }


def async_clients(server: ProviderServer) -> Dict[str, Any]:
    return {
        "openai": openai.AsyncOpenAI(api_key="test", base_url=server.url("openai"), max_retries=0),
        "anthropic": anthropic.AsyncAnthropic(api_key="test", base_url=server.url("anthropic"), max_retries=0),
        "google": genai.Client(
            api_key="test", http_options=genai_types.HttpOptions(base_url=server.url("google"), api_version="v1beta")
        ),
    }


async def run_async_closed(server: ProviderServer, request: Dict[str, Any], document: Dict[str, Any], **options: Any) -> Any:
    """``providers.run_async`` with fresh async clients, closed before the loop ends."""
    given = async_clients(server)
    try:
        return await providers.run_async(request, document, given, KEY, **options)
    finally:
        await given["openai"].close()
        await given["anthropic"].close()
        await given["google"].aio.aclose()


OVERLOADED: Dict[str, Any] = {"status": 529, "body": {"error": {"type": "overloaded_error", "message": "Overloaded"}}}
# Anthropic's 429: the account's quota resets in an hour, far past the run's 2 s cap.
QUOTA: Dict[str, Any] = {
    "status": 429,
    "headers": {"retry-after": "3600"},
    "body": {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your daily rate limit"}},
}
GEMINI_OK: Dict[str, Any] = {
    "status": 200,
    "body": {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "A migration timed out."}]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {"promptTokenCount": 21, "candidatesTokenCount": 6, "totalTokenCount": 27},
        "modelVersion": "gemini-2.5-pro-preview-06-05",
        "responseId": "resp-g-1",
    },
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


def expected_bodies(spec_doc: Dict[str, Any], request: Dict[str, Any] = REQUEST) -> Dict[str, Dict[str, Any]]:
    return {r["route_id"]: r["lowered"]["body"] for r in retryledger.lower_routes(request, spec_doc)}


def test_one_call_over_openai_anthropic_and_google(serve: Any) -> None:
    server = serve({"openai": [OVERLOADED], "anthropic": [QUOTA], "google": [GEMINI_OK]})
    document = spec(["openai", "anthropic", "google"])
    clock = FakeClock()
    result = providers.run(REQUEST, document, clients(server), KEY, clock=clock, sleep=clock.sleep)

    assert isinstance(result.value, genai_types.GenerateContentResponse)
    assert result.value.text == "A migration timed out."
    # Each server saw exactly the body the lowering promised for its route,
    # on every attempt, with the run's idempotency key.
    promised = expected_bodies(document)
    for provider in ("openai", "anthropic", "google"):
        bodies = server.bodies(provider)
        assert bodies, provider
        assert all(b == promised[provider] for b in bodies), (provider, bodies, promised[provider])
    assert {r.idempotency_key for r in server.received} == {KEY}
    assert [r.path for r in server.received] == [
        "/openai/chat/completions",
        "/openai/chat/completions",
        "/anthropic/v1/messages",
        "/google/v1beta/models/gemini-2.5-pro:generateContent",
    ]
    # Physical requests equal the receipt's attempts.
    receipt = result.receipt
    assert receipt["attempt_count"] == len(server.received) == 4
    schedule = receipt["schedule"]
    assert [(e["route_id"], e["outcome"]) for e in schedule] == [
        ("openai", "unavailable"),
        ("openai", "unavailable"),
        ("anthropic", "rate_limited"),
        ("google", "success"),
    ]
    # The 429's hour cannot clear within the run: the route was skipped, not waited.
    assert max(clock.sleeps) < 2000
    # Requested and served model per attempt; a failure names no served model.
    assert [e["model"] for e in schedule] == [
        {"requested": "gpt-4.1"},
        {"requested": "gpt-4.1"},
        {"requested": "claude-sonnet-4-5"},
        {"requested": "gemini-2.5-pro", "served": "gemini-2.5-pro-preview-06-05"},
    ]
    assert receipt["fallback_used"] is True and receipt["final_route_id"] == "google"
    # Each attempt records its route's lowered body digest.
    digests = {r["route_id"]: r["lowered"]["body_sha256"] for r in retryledger.lower_routes(REQUEST, document)}
    attempts = result.bundle["attempts"]["attempts"]
    assert [a["request_body_sha256"] for a in attempts] == [digests[e["route_id"]] for e in schedule]
    assert retryledger.verify_bundle(result.bundle)["kind"] == "verified"


def test_the_async_driver_sends_the_same_bodies(serve: Any) -> None:
    server = serve({"openai": [OVERLOADED], "anthropic": [QUOTA], "google": [GEMINI_OK]})
    document = spec(["openai", "anthropic", "google"], attempts={"openai": 1})
    clock = FakeClock()
    result = asyncio.run(run_async_closed(server, REQUEST, document, clock=clock, sleep=clock.async_sleep))
    promised = expected_bodies(document)
    assert [r.body for r in server.received] == [promised["openai"], promised["anthropic"], promised["google"]]
    assert result.receipt["attempt_count"] == 3
    assert result.receipt["schedule"][-1]["model"] == {"requested": "gemini-2.5-pro", "served": "gemini-2.5-pro-preview-06-05"}


def test_each_sdk_answer_names_its_served_model(serve: Any) -> None:
    chat = {
        "status": 200,
        "body": {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4.1-2025-04-14",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22},
        },
    }
    message = {
        "status": 200,
        "body": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 20, "output_tokens": 2},
        },
    }
    server = serve({"openai": [chat], "anthropic": [message], "google": [GEMINI_OK]})
    for first, served in (
        ("openai", "gpt-4.1-2025-04-14"),
        ("anthropic", "claude-sonnet-4-5-20250929"),
        ("google", "gemini-2.5-pro-preview-06-05"),
    ):
        result = providers.run(REQUEST, spec([first]), clients(server), KEY)
        assert result.receipt["schedule"] == [dict(result.receipt["schedule"][0], model={"requested": MODELS[first][1], "served": served})]
        assert server.bodies(first)[-1] == expected_bodies(spec([first]))[first]


def test_an_answer_without_model_or_usage_records_them_as_unknown(serve: Any) -> None:
    bare = {
        "status": 200,
        "body": {"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP", "index": 0}]},
    }
    server = serve({"google": [bare]})
    result = providers.run(REQUEST, spec(["google"]), clients(server), KEY)
    entry = result.receipt["schedule"][0]
    assert entry["model"] == {"requested": "gemini-2.5-pro"}  # no served model invented
    attempt = result.bundle["attempts"]["attempts"][0]
    assert "usage" not in attempt  # no usage invented
    assert entry["cost"] == 3000  # the reservation stands


def test_a_route_without_a_client_is_refused_before_any_request(serve: Any) -> None:
    server = serve({"openai": [OVERLOADED], "anthropic": [QUOTA], "google": [GEMINI_OK]})
    given = clients(server)
    del given["anthropic"]
    with pytest.raises(retryledger.RouteClientMissingError) as info:
        providers.run(REQUEST, spec(["openai", "anthropic", "google"]), given, KEY)
    assert info.value.code == "route_client_missing"
    assert isinstance(info.value, retryledger.PolicyError) and isinstance(info.value, KeyError)
    assert info.value.path == "/routes/1/route_id"
    assert "anthropic" in info.value.message and "openai" not in info.value.message.split(":", 1)[1]
    assert server.received == []


def test_a_client_that_retries_on_its_own_is_refused_before_any_request(serve: Any) -> None:
    server = serve({"openai": [OVERLOADED], "anthropic": [QUOTA], "google": [GEMINI_OK]})
    given = clients(server)
    given["anthropic"] = anthropic.Anthropic(api_key="test", base_url=server.url("anthropic"))  # max_retries=2
    with pytest.raises(retryledger.PolicyError) as info:
        providers.run(REQUEST, spec(["openai", "anthropic", "google"]), given, KEY)
    assert info.value.code == "retry_owner_not_harness"
    given = clients(server)
    given["google"] = genai.Client(
        api_key="test",
        http_options=genai_types.HttpOptions(
            base_url=server.url("google"), api_version="v1beta", retry_options=genai_types.HttpRetryOptions(attempts=3)
        ),
    )
    with pytest.raises(retryledger.PolicyError) as info:
        providers.run(REQUEST, spec(["openai", "anthropic", "google"]), given, KEY)
    assert info.value.code == "retry_owner_not_harness"
    assert server.received == []


def test_a_route_release_without_lowering_settings_is_refused(serve: Any) -> None:
    server = serve({"google": [GEMINI_OK]})
    document = spec(["openai", "google"])
    del document["routes"][0]["release"]["lowering"]
    with pytest.raises(retryledger.DecodeError) as info:
        providers.run(REQUEST, document, clients(server), KEY)
    assert (info.value.code, info.value.path) == ("missing_field", "/routes/0/release/lowering")
    assert server.received == []


def test_the_served_model_is_the_answer_s_own(serve: Any) -> None:
    # The served model is read from the answer, not copied from the request.
    body: Dict[str, Any] = copy.deepcopy(GEMINI_OK["body"])
    body["modelVersion"] = "gemini-2.5-flash-001"
    answer = {"status": 200, "body": body}
    server = serve({"google": [answer]})
    result = providers.run(REQUEST, spec(["google"]), clients(server), KEY)
    assert result.receipt["schedule"][0]["model"]["served"] == "gemini-2.5-flash-001"
    assert json.loads(result.bundle_json)["receipt"]["schedule"][0]["model"]["served"] == "gemini-2.5-flash-001"


def test_a_client_of_another_sdk_is_refused_before_any_request(serve: Any) -> None:
    server = serve({"openai": [OVERLOADED], "anthropic": [QUOTA], "google": [GEMINI_OK]})
    given = clients(server)
    given["openai"], given["anthropic"] = given["anthropic"], given["openai"]
    with pytest.raises(retryledger.DecodeError) as info:
        providers.run(REQUEST, spec(["openai", "anthropic", "google"]), given, KEY)
    assert (info.value.code, info.value.path) == ("invalid_type", "/clients/openai")
    given = clients(server)
    given["google"] = openai.OpenAI(api_key="test", base_url=server.url("openai"), max_retries=0)
    with pytest.raises(retryledger.DecodeError) as info:
        providers.run(REQUEST, spec(["openai", "anthropic", "google"]), given, KEY)
    assert (info.value.code, info.value.path) == ("invalid_type", "/clients/google")
    assert server.received == []


# OpenAI's 429 for an account whose quota is spent: `quota_exhausted`.
SPENT: Dict[str, Any] = {
    "status": 429,
    "body": {"error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": "You exceeded your current quota."}},
}


def test_a_spent_quota_falls_back_to_another_provider_under_skip_route(serve: Any) -> None:
    server = serve({"openai": [SPENT], "google": [GEMINI_OK]})
    base = spec(["openai", "google"])
    document = {**base, "backoff": {**base["backoff"], "quota_exhausted": "skip_route"}}
    clock = FakeClock()
    result = providers.run(REQUEST, document, clients(server), KEY, clock=clock, sleep=clock.sleep)
    assert result.value.text == "A migration timed out."
    schedule = result.receipt["schedule"]
    assert [(e["route_id"], e["outcome"]) for e in schedule] == [("openai", "quota_exhausted"), ("google", "success")]
    # One request to the spent account, none repeated: the route was left at once.
    assert [r.provider for r in server.received] == ["openai", "google"]
    assert result.receipt["attempt_count"] == len(server.received)
    assert retryledger.verify_bundle(result.bundle)["kind"] == "verified"


def test_a_spent_quota_stops_the_run_by_default(serve: Any) -> None:
    server = serve({"openai": [SPENT], "google": [GEMINI_OK]})
    with pytest.raises(retryledger.RunStoppedError) as stopped:
        providers.run(REQUEST, spec(["openai", "google"]), clients(server), KEY, clock=FakeClock(), sleep=FakeClock().sleep)
    assert stopped.value.terminal == "stop_non_retryable"
    assert [r.provider for r in server.received] == ["openai"]
