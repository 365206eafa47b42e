"""Provider error tables through the real SDKs against loopback servers.

A route that names its provider family is judged by the core's provider
tables from the error body the SDK hands over (docs/PROVIDERS.md): OpenAI's
``insufficient_quota`` stops after one attempt, Anthropic's 529
``overloaded_error`` retries, and Gemini's per-minute RESOURCE_EXHAUSTED
waits the body's ``retryDelay`` (through httpx, with a fake clock). The host
passes the body; it classifies nothing.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, Iterator, List, Optional

import anthropic
import httpx
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

import retryledger
import retryledger.anthropic as rl_anthropic
import retryledger.google_genai as rl_google
import retryledger.httpx as rl_httpx
import retryledger.openai as rl_openai
from retryledger import Step

from conftest import KEY, FakeClock, make_policy
from loopback import Reply, ScriptedServer

QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "fake-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "fake-model",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2},
}
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def gemini(quota_id: str, retry_delay: str) -> Dict[str, Any]:
    return {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{"quotaId": quota_id}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay},
            ],
        }
    }


def policy(family: Optional[str]) -> Dict[str, Any]:
    document = make_policy(backoff={"base_ms": 10, "max_ms": 50, "retry_after_cap_ms": 2_000}, max_total_attempts=3)
    routes: List[Dict[str, Any]] = copy.deepcopy(document["routes"])
    if family is not None:
        for r in routes:
            r["provider_family"] = family
    document["routes"] = routes
    return document


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ScriptedServer] = []

    def start(scripts: Dict[str, List[Reply]], body: Any) -> ScriptedServer:
        servers.append(ScriptedServer(scripts, body).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def attempts(bundle: Dict[str, Any]) -> List[Dict[str, Any]]:
    found: List[Dict[str, Any]] = bundle["attempts"]["attempts"]
    return found


# ---- openai: insufficient_quota stops after one attempt ----------------------


def openai_clients(server: ScriptedServer) -> Dict[str, openai.OpenAI]:
    return {
        "private-primary": openai.OpenAI(api_key="test", base_url=server.url("primary") + "/v1", max_retries=0),
        "external-fallback": openai.OpenAI(api_key="test", base_url=server.url("fallback") + "/v1", max_retries=0),
    }


def ask_openai(client: openai.OpenAI, step: Step) -> str:
    reply = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "INC-4471"}])
    content = reply.choices[0].message.content
    assert content is not None
    return content


def openai_body(status: int) -> Any:
    return COMPLETION if status == 200 else QUOTA


QUOTA_SCRIPT: Dict[str, List[Reply]] = {"primary": [(429, {"retry-after": "1"})], "fallback": [(200, {})]}


def test_openai_insufficient_quota_stops_after_one_attempt(serve: Any) -> None:
    server = serve(QUOTA_SCRIPT, openai_body)
    with pytest.raises(retryledger.RunStoppedError) as info:
        rl_openai.run(policy("openai"), openai_clients(server), ask_openai, KEY)
    assert info.value.code == "stop_non_retryable"
    assert server.count() == 1
    assert isinstance(info.value.__cause__, openai.RateLimitError)
    assert [a["outcome"] for a in attempts(info.value.bundle)] == [
        {"class": "non_retryable", "kind": "quota_exhausted"}
    ]
    assert retryledger.verify_bundle(info.value.bundle_json)["kind"] == "verified"


def test_without_a_family_the_same_answer_is_retried(serve: Any) -> None:
    server = serve({"primary": [(429, {"retry-after-ms": "5"})], "fallback": [(200, {})]}, openai_body)
    result = rl_openai.run(policy(None), openai_clients(server), ask_openai, KEY)
    assert result.value == "ok"
    assert [r.route for r in server.requests] == ["primary", "primary", "fallback"]


def test_openai_async_insufficient_quota_stops(serve: Any) -> None:
    import asyncio

    server = serve(QUOTA_SCRIPT, openai_body)
    clients = {
        "private-primary": openai.AsyncOpenAI(api_key="test", base_url=server.url("primary") + "/v1", max_retries=0),
        "external-fallback": openai.AsyncOpenAI(api_key="test", base_url=server.url("fallback") + "/v1", max_retries=0),
    }

    async def ask(client: openai.AsyncOpenAI, step: Step) -> str:
        reply = await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
        return reply.choices[0].message.content or ""

    with pytest.raises(retryledger.RunStoppedError) as info:
        asyncio.run(rl_openai.run_async(policy("openai"), clients, ask, KEY))
    assert info.value.code == "stop_non_retryable"
    assert server.count() == 1


# ---- anthropic: a 529 overloaded_error retries -------------------------------


def anthropic_body(status: int) -> Any:
    return MESSAGE if status == 200 else OVERLOADED


def anthropic_clients(server: ScriptedServer) -> Dict[str, anthropic.Anthropic]:
    return {
        "private-primary": anthropic.Anthropic(api_key="test", base_url=server.url("primary"), max_retries=0),
        "external-fallback": anthropic.Anthropic(api_key="test", base_url=server.url("fallback"), max_retries=0),
    }


def ask_anthropic(client: anthropic.Anthropic, step: Step) -> str:
    reply = client.messages.create(model="fake-model", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    block = reply.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    return block.text


def test_anthropic_529_overloaded_retries(serve: Any) -> None:
    server = serve({"primary": [(529, {"retry-after-ms": "5"}), (200, {})], "fallback": [(200, {})]}, anthropic_body)
    result = rl_anthropic.run(policy("anthropic"), anthropic_clients(server), ask_anthropic, KEY)
    assert result.value == "ok"
    assert [r.route for r in server.requests] == ["primary", "primary"]
    assert [a["outcome"] for a in attempts(result.bundle)] == [
        {"class": "retryable", "kind": "unavailable", "retry_after_ms": 5, "retry_after_source": "retry-after-ms"},
        {"class": "success"},
    ]


def test_anthropic_rate_limit_reset_header_sets_the_wait(serve: Any) -> None:
    now_ms = 1_764_777_946_000
    reset = "2025-12-03T16:05:47.500Z"  # 1.5 s after the wall clock below
    server = serve(
        {
            "primary": [
                (429, {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": reset}),
                (200, {}),
            ],
            "fallback": [(200, {})],
        },
        lambda status: MESSAGE if status == 200 else {"type": "error", "error": {"type": "rate_limit_error", "message": "x"}},
    )
    clock = FakeClock()
    result = rl_anthropic.run(
        policy("anthropic"),
        anthropic_clients(server),
        ask_anthropic,
        KEY,
        clock=clock,
        sleep=clock.sleep,
        wall_clock=lambda: float(now_ms),
    )
    assert result.value == "ok"
    first = attempts(result.bundle)[0]["outcome"]
    assert first == {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 1500, "retry_after_source": "ratelimit_reset"}
    assert clock.sleeps[-1] == 1500


# ---- httpx: Gemini's envelope ------------------------------------------------


def gemini_server(serve: Any, quota_id: str) -> ScriptedServer:
    server: ScriptedServer = serve(
        {"primary": [(429, {}), (200, {})], "fallback": [(200, {})]},
        lambda status: {"ok": True} if status == 200 else gemini(quota_id, "1.5s"),
    )
    return server


def post(client: httpx.Client, step: Step) -> httpx.Response:
    route = "primary" if step.route_id == "private-primary" else "fallback"
    return client.post(f"/{route}/v1beta/models/gemini:generateContent", json={"contents": []})


def test_httpx_gemini_per_minute_waits_the_retry_delay(serve: Any) -> None:
    server = gemini_server(serve, "GenerateRequestsPerMinutePerProjectPerModel-FreeTier")
    clock = FakeClock()
    with httpx.Client(base_url=server.base()) as client:
        result = rl_httpx.run(policy("google"), client, post, KEY, clock=clock, sleep=clock.sleep)
    assert result.value.json() == {"ok": True}
    assert server.count() == 2
    assert clock.sleeps == [1500]
    assert attempts(result.bundle)[0]["outcome"] == {
        "class": "retryable",
        "kind": "rate_limited",
        "retry_after_ms": 1500,
        "retry_after_source": "retry_info",
    }


def test_httpx_gemini_per_day_stops_after_one_attempt(serve: Any) -> None:
    server = gemini_server(serve, "GenerateRequestsPerDayPerProjectPerModel-FreeTier")
    with httpx.Client(base_url=server.base()) as client:
        with pytest.raises(retryledger.RunStoppedError) as info:
            rl_httpx.run(policy("google"), client, post, KEY)
    assert info.value.code == "stop_non_retryable"
    assert server.count() == 1


def test_httpx_streamed_error_body_is_read_bounded(serve: Any) -> None:
    server = gemini_server(serve, "GenerateRequestsPerDayPerProjectPerModel-FreeTier")

    def streamed(client: httpx.Client, step: Step) -> httpx.Response:
        request = client.build_request("POST", "/primary/v1beta/models/gemini:generateContent", json={})
        return client.send(request, stream=True)

    with httpx.Client(base_url=server.base()) as client:
        with pytest.raises(retryledger.RunStoppedError) as info:
            rl_httpx.run(policy("google"), client, streamed, KEY)
    assert info.value.code == "stop_non_retryable"


# ---- the facts a host passes ---------------------------------------------------


def test_facts_carry_the_bounded_body_and_never_classify() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    text = json.dumps(QUOTA)
    response = httpx2.Response(429, request=request, content=text.encode())
    error = openai.RateLimitError("quota", response=response, body=QUOTA["error"])
    facts = retryledger.facts_of(error, now_unix_ms=1)
    assert facts.to_dict()["error_body"] == text
    long = httpx2.Response(429, request=request, content=("x" * 20_000).encode())
    facts = retryledger.facts_of(openai.RateLimitError("big", response=long, body=None), now_unix_ms=1)
    body = facts.to_dict()["error_body"]
    assert len(body) == retryledger._tables.MAX_ERROR_BODY_BYTES + 1
    judged = retryledger.judge(retryledger.Facts(result="raised", status=429, error_body=body, provider_family="openai"))
    assert judged["notes"] == ["body_oversize"]
    assert judged["outcome"] == {"class": "retryable", "kind": "rate_limited"}


def test_an_unpaired_surrogate_in_a_body_is_replaced() -> None:
    class Raised(Exception):
        status_code = 429
        body = '{"error": {"code": "insufficient_quota", "message": "\ud800"}}'

    facts = retryledger.facts_of(Raised(), now_unix_ms=1)
    assert "\ud800" not in facts.to_dict()["error_body"]
    judged = retryledger.judge(
        retryledger.Facts(result="raised", status=429, error_body=facts.to_dict()["error_body"], provider_family="openai")
    )
    assert judged["outcome"] == {"class": "non_retryable", "kind": "quota_exhausted"}


# ---- google-genai: Gemini's envelope through the real SDK --------------------


def genai_clients(server: ScriptedServer, **options: Any) -> Dict[str, genai.Client]:
    return {
        "private-primary": genai.Client(
            api_key="test", http_options=genai_types.HttpOptions(base_url=server.url("primary"), api_version="v1beta", **options)
        ),
        "external-fallback": genai.Client(
            api_key="test", http_options=genai_types.HttpOptions(base_url=server.url("fallback"), api_version="v1beta")
        ),
    }


GENERATED = {
    "candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP", "index": 0}],
    "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1, "totalTokenCount": 4},
}


def generate(client: genai.Client, options: genai_types.HttpOptions, step: Step) -> str:
    reply = client.models.generate_content(
        model="gemini-2.0-flash", contents="INC-4471", config=genai_types.GenerateContentConfig(http_options=options)
    )
    return reply.text or ""


def genai_server(serve: Any, quota_id: str) -> ScriptedServer:
    server: ScriptedServer = serve(
        {"primary": [(429, {}), (200, {})], "fallback": [(200, {})]},
        lambda status: GENERATED if status == 200 else gemini(quota_id, "1.5s"),
    )
    return server


def test_google_genai_per_minute_waits_the_retry_delay(serve: Any) -> None:
    server = genai_server(serve, "GenerateRequestsPerMinutePerProjectPerModel-FreeTier")
    clock = FakeClock()
    result = rl_google.run(policy("google"), genai_clients(server), generate, KEY, clock=clock, sleep=clock.sleep)
    assert result.value == "ok"
    assert server.count() == 2
    assert {r.idempotency_key for r in server.requests} == {KEY}
    assert clock.sleeps == [1500]
    assert attempts(result.bundle)[0]["outcome"] == {
        "class": "retryable",
        "kind": "rate_limited",
        "retry_after_ms": 1500,
        "retry_after_source": "retry_info",
    }


def test_google_genai_refuses_a_route_without_a_client_before_any_request(serve: Any) -> None:
    server = genai_server(serve, "GenerateRequestsPerMinutePerProjectPerModel-FreeTier")
    only_primary = {"private-primary": genai_clients(server)["private-primary"]}
    with pytest.raises(KeyError, match=r"google-genai client: no client for route\(s\) external-fallback"):
        rl_google.run(policy("google"), only_primary, generate, KEY)
    assert server.count() == 0


def test_google_genai_per_day_stops_after_one_attempt(serve: Any) -> None:
    server = genai_server(serve, "GenerateRequestsPerDayPerProjectPerModel-FreeTier")
    with pytest.raises(retryledger.RunStoppedError) as info:
        rl_google.run(policy("google"), genai_clients(server), generate, KEY)
    assert info.value.code == "stop_non_retryable"
    assert server.count() == 1
    assert isinstance(info.value.__cause__, genai_errors.ClientError)
    assert [a["outcome"] for a in attempts(info.value.bundle)] == [{"class": "non_retryable", "kind": "quota_exhausted"}]


def test_google_genai_async_per_minute_waits(serve: Any) -> None:
    import asyncio

    server = genai_server(serve, "GenerateRequestsPerMinutePerProjectPerModel-FreeTier")
    clock = FakeClock()

    async def agenerate(client: genai.Client, options: genai_types.HttpOptions, step: Step) -> str:
        reply = await client.aio.models.generate_content(
            model="gemini-2.0-flash", contents="x", config=genai_types.GenerateContentConfig(http_options=options)
        )
        return reply.text or ""

    result = asyncio.run(
        rl_google.run_async(policy("google"), genai_clients(server), agenerate, KEY, clock=clock, sleep=clock.async_sleep)
    )
    assert result.value == "ok"
    assert clock.sleeps == [1500]


def test_google_genai_client_that_retries_is_refused_before_any_request(serve: Any) -> None:
    server = genai_server(serve, "GenerateRequestsPerMinutePerProjectPerModel-FreeTier")
    for retry in (genai_types.HttpRetryOptions(), genai_types.HttpRetryOptions(attempts=3)):
        with pytest.raises(retryledger.PolicyError) as info:
            rl_google.run(policy("google"), genai_clients(server, retry_options=retry), generate, KEY)
        assert info.value.code == "retry_owner_not_harness"
    with pytest.raises(retryledger.PolicyError):
        rl_google.require_no_retries(object())
    rl_google.require_no_retries(genai_clients(server, retry_options=genai_types.HttpRetryOptions(attempts=1))["private-primary"])
    assert server.count() == 0


def test_google_genai_naive_retries_multiply(serve: Any) -> None:
    server = serve({"primary": [(429, {})]}, lambda status: gemini("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "0.01s"))
    client = genai.Client(
        api_key="test",
        http_options=genai_types.HttpOptions(
            base_url=server.url("primary"),
            api_version="v1beta",
            retry_options=genai_types.HttpRetryOptions(attempts=3, initial_delay=0.001, max_delay=0.002),
        ),
    )
    for _ in range(3):
        with pytest.raises(genai_errors.ClientError):
            client.models.generate_content(model="gemini-2.0-flash", contents="x")
    assert server.count() == 9
