"""The anthropic integration against a fake provider: a real HTTP server on 127.0.0.1.

The real ``anthropic`` client sends ``POST /v1/messages`` to the server; the
first path segment names the route. The SDK's default client
(max_retries=2) under a naive three-attempt harness makes the server count
3 x 3 = 9 requests for one logical call; the integration refuses that client;
under retryledger the count is the policy's bound, every request carries the
same Idempotency-Key, and none arrives before its Retry-After.
"""

from __future__ import annotations

import hashlib

import asyncio
from typing import Any, Dict, Iterator, List, Optional

import anthropic
import httpx2
import pytest
from anthropic.types import TextBlock

import retryledger
import retryledger.anthropic as rl_anthropic
from retryledger import Step

from conftest import KEY, make_policy
from loopback import Reply, ScriptedServer, closed_port

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "fake-model",
    "content": [{"type": "text", "text": "severity: high"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2},
}

ERROR_TYPES = {
    400: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}


def body(status: int) -> Any:
    if status == 200:
        return MESSAGE
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": f"status {status}"}}


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ScriptedServer] = []

    def start(scripts: Dict[str, List[Reply]]) -> ScriptedServer:
        servers.append(ScriptedServer(scripts, body).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def policy(**overrides: Any) -> Dict[str, Any]:
    document = make_policy(backoff={"base_ms": 10, "max_ms": 50, "retry_after_cap_ms": 2_000}, max_total_attempts=3)
    document.update(overrides)
    return document


def clients(server: ScriptedServer, primary: str = "primary", max_retries: int = 0) -> Dict[str, anthropic.Anthropic]:
    return {
        "private-primary": anthropic.Anthropic(api_key="test", base_url=server.url(primary), max_retries=max_retries),
        "external-fallback": anthropic.Anthropic(api_key="test", base_url=server.url("fallback"), max_retries=0),
    }


def async_clients(server: ScriptedServer) -> Dict[str, anthropic.AsyncAnthropic]:
    return {
        "private-primary": anthropic.AsyncAnthropic(api_key="test", base_url=server.url("primary"), max_retries=0),
        "external-fallback": anthropic.AsyncAnthropic(api_key="test", base_url=server.url("fallback"), max_retries=0),
    }


def text_of(message: anthropic.types.Message) -> str:
    block = message.content[0]
    assert isinstance(block, TextBlock)
    return block.text


def ask(client: anthropic.Anthropic, step: Optional[Step] = None) -> str:
    reply = client.messages.create(
        model="fake-model", max_tokens=64, messages=[{"role": "user", "content": "INC-4471"}]
    )
    return text_of(reply)


async def ask_async(client: anthropic.AsyncAnthropic, step: Step) -> str:
    reply = await client.messages.create(
        model="fake-model", max_tokens=64, messages=[{"role": "user", "content": "INC-4471"}]
    )
    return text_of(reply)


def outcomes(result: retryledger.RunResult[Any]) -> List[Dict[str, Any]]:
    return [a["outcome"] for a in result.bundle["attempts"]["attempts"]]


def test_success_on_the_first_request(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]})
    result = rl_anthropic.run(policy(), clients(server), ask, KEY)
    assert result.value == "severity: high"
    assert [r.path for r in server.requests] == ["/primary/v1/messages"]
    assert server.requests[0].idempotency_key == KEY
    assert outcomes(result) == [{"class": "success"}]
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"


def test_rate_limited_then_success_waits_for_the_hint_with_one_key(serve: Any) -> None:
    server = serve(
        {
            "primary": [(429, {"retry-after": "1", "retry-after-ms": "150", "anthropic-ratelimit-requests-remaining": "0"}), (200, {})],
            "fallback": [(200, {})],
        }
    )
    result = rl_anthropic.run(policy(), clients(server), ask, KEY)
    assert result.value == "severity: high"
    assert [r.route for r in server.requests] == ["primary", "primary"]
    assert {r.idempotency_key for r in server.requests} == {KEY}
    assert server.requests[1].arrived - server.replied[0] >= 0.150
    assert outcomes(result) == [
        {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 150},
        {"class": "success"},
    ]
    assert result.receipt["fallback_used"] is False


def test_unavailable_then_the_fallback_route(serve: Any) -> None:
    server = serve({"primary": [(503, {"retry-after-ms": "20"})], "fallback": [(200, {})]})
    result = rl_anthropic.run(policy(), clients(server), ask, KEY)
    assert result.value == "severity: high"
    assert [r.route for r in server.requests] == ["primary", "primary", "fallback"]
    assert {r.idempotency_key for r in server.requests} == {KEY}
    assert server.requests[1].arrived - server.replied[0] >= 0.020
    assert outcomes(result)[:2] == [{"class": "retryable", "kind": "unavailable", "retry_after_ms": 20}] * 2
    assert result.receipt["fallback_used"] is True


def test_overloaded_529_is_retried_then_falls_back(serve: Any) -> None:
    server = serve({"primary": [(529, {})], "fallback": [(200, {})]})
    result = rl_anthropic.run(policy(), clients(server), ask, KEY)
    assert result.value == "severity: high"
    assert [r.route for r in server.requests] == ["primary", "primary", "fallback"]
    first = outcomes(result)[0]
    assert first["class"] == "retryable"


def test_a_bad_request_stops_without_retry(serve: Any) -> None:
    server = serve({"primary": [(400, {})], "fallback": [(200, {})]})
    with pytest.raises(retryledger.RunStoppedError) as info:
        rl_anthropic.run(policy(), clients(server), ask, KEY)
    assert server.count() == 1
    assert isinstance(info.value.__cause__, anthropic.BadRequestError)
    attempts = info.value.bundle["attempts"]["attempts"]
    assert [a["outcome"] for a in attempts] == [{"class": "non_retryable", "kind": "invalid_request"}]


# ---- exercise 7: retries at two layers multiply ------------------------------

ALWAYS_LIMITED: Dict[str, List[Reply]] = {
    "primary": [(429, {"retry-after-ms": "10"})],
    "fallback": [(429, {"retry-after-ms": "10"})],
}


def test_naive_harness_over_the_default_client_sends_nine_requests(serve: Any) -> None:
    server = serve(ALWAYS_LIMITED)
    client = anthropic.Anthropic(api_key="test", base_url=server.url("primary"))  # max_retries=2 by default
    assert client.max_retries == 2
    for _ in range(3):  # a naive harness: three attempts of its own
        try:
            ask(client)
            break
        except anthropic.APIError:
            continue
    assert server.count() == 9 == 3 * 3


def test_the_default_client_is_refused_before_any_request(serve: Any) -> None:
    server = serve(ALWAYS_LIMITED)
    with pytest.raises(retryledger.PolicyError) as info:
        rl_anthropic.run(policy(), clients(server, max_retries=2), ask, KEY)
    assert info.value.code == "retry_owner_not_harness"
    assert server.count() == 0
    with pytest.raises(retryledger.PolicyError):
        asyncio.run(
            rl_anthropic.run_async(
                policy(),
                {"private-primary": anthropic.AsyncAnthropic(api_key="test", base_url=server.url("primary"))},
                ask_async,
                KEY,
            )
        )
    assert server.count() == 0


def test_with_sdk_retries_off_the_count_is_the_policy_bound(serve: Any) -> None:
    server = serve(ALWAYS_LIMITED)
    with pytest.raises(retryledger.RunStoppedError):
        rl_anthropic.run(policy(), clients(server), ask, KEY)
    assert server.count() == policy()["max_total_attempts"] == 3
    assert {r.idempotency_key for r in server.requests} == {KEY}
    for request, previous_reply in zip(server.requests[1:], server.replied):
        assert request.arrived - previous_reply >= 0.010


# ---- async -------------------------------------------------------------------


def test_async_rate_limited_then_fallback(serve: Any) -> None:
    server = serve(
        {"primary": [(429, {"retry-after": "1", "retry-after-ms": "150"}), (503, {"retry-after-ms": "20"})], "fallback": [(200, {})]}
    )
    result = asyncio.run(rl_anthropic.run_async(policy(), async_clients(server), ask_async, KEY))
    assert result.value == "severity: high"
    assert [r.route for r in server.requests] == ["primary", "primary", "fallback"]
    assert {r.idempotency_key for r in server.requests} == {KEY}
    # The async client's requests are hooked too: each attempt records the body the server received.
    sent = [a["request_body_sha256"] for a in result.bundle["attempts"]["attempts"]]
    assert sent == [hashlib.sha256(r.body).hexdigest() for r in server.requests]
    assert server.requests[1].arrived - server.replied[0] >= 0.150
    assert outcomes(result)[:2] == [
        {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 150},
        {"class": "retryable", "kind": "unavailable", "retry_after_ms": 20},
    ]


def test_async_bad_request_stops(serve: Any) -> None:
    server = serve({"primary": [(400, {})], "fallback": [(200, {})]})
    with pytest.raises(retryledger.RunStoppedError):
        asyncio.run(rl_anthropic.run_async(policy(), async_clients(server), ask_async, KEY))
    assert server.count() == 1


def test_connection_refused_is_unavailable_and_falls_back(serve: Any) -> None:
    server = serve({"fallback": [(200, {})]})
    routes = {
        "private-primary": anthropic.Anthropic(api_key="test", base_url=f"http://127.0.0.1:{closed_port()}", max_retries=0),
        "external-fallback": anthropic.Anthropic(api_key="test", base_url=server.url("fallback"), max_retries=0),
    }
    result = rl_anthropic.run(policy(), routes, ask, KEY)
    assert outcomes(result)[:2] == [{"class": "retryable", "kind": "unavailable"}] * 2
    assert server.count("fallback") == 1


def test_a_missing_route_client_is_refused(serve: Any) -> None:
    server = serve({"primary": [(200, {})]})
    with pytest.raises(KeyError):
        rl_anthropic.run(policy(), {"private-primary": clients(server)["private-primary"]}, ask, KEY)
    assert server.count() == 0


# ---- the core's judgement of the SDK's exceptions -----------------------------


def _status_error(cls: Any, status: int, headers: Optional[Dict[str, str]] = None) -> Any:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/messages")
    response = httpx2.Response(status, headers=headers or {}, request=request)
    return cls(f"status {status}", response=response, body=body(status))


def _judged(exc: BaseException) -> Dict[str, Any]:
    """The core's judgement of the facts a driver reads off an SDK exception."""
    return retryledger.judge(retryledger.facts_of(exc))


@pytest.mark.parametrize(
    ("cls", "status", "outcome"),
    [
        (anthropic.BadRequestError, 400, {"class": "non_retryable", "kind": "invalid_request"}),
        (anthropic.AuthenticationError, 401, {"class": "non_retryable", "kind": "rejected"}),
        (anthropic.PermissionDeniedError, 403, {"class": "non_retryable", "kind": "policy_denied"}),
        (anthropic.NotFoundError, 404, {"class": "non_retryable", "kind": "invalid_request"}),
        (anthropic.UnprocessableEntityError, 422, {"class": "non_retryable", "kind": "invalid_request"}),
        (anthropic.RateLimitError, 429, {"class": "retryable", "kind": "rate_limited"}),
        (anthropic.InternalServerError, 500, {"class": "retryable", "kind": "unavailable"}),
        (anthropic.ServiceUnavailableError, 503, {"class": "retryable", "kind": "unavailable"}),
        (anthropic.OverloadedError, 529, {"class": "retryable", "kind": "unavailable"}),
        (anthropic.APIStatusError, 529, {"class": "retryable", "kind": "unavailable"}),
    ],
)
def test_status_errors_map_to_outcomes(cls: Any, status: int, outcome: Dict[str, Any]) -> None:
    judgement = _judged(_status_error(cls, status))
    assert judgement == {"outcome": outcome, "rule": "status"}


def test_rate_limit_hints() -> None:
    seconds = _judged(_status_error(anthropic.RateLimitError, 429, {"retry-after": "2"}))
    millis = _judged(_status_error(anthropic.RateLimitError, 429, {"retry-after": "2", "retry-after-ms": "250.5"}))
    ratelimit_only = _judged(
        _status_error(anthropic.RateLimitError, 429, {"anthropic-ratelimit-requests-reset": "2030-01-01T00:00:00Z"})
    )
    assert seconds["outcome"]["retry_after_ms"] == 2_000
    assert millis["outcome"]["retry_after_ms"] == 251
    assert "retry_after_ms" not in ratelimit_only["outcome"]


def test_transport_errors_map_to_outcomes() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/messages")
    timeout = _judged(anthropic.APITimeoutError(request=request))
    assert timeout == {"outcome": {"class": "retryable", "kind": "timeout_before_response"}, "rule": "transport"}
    try:
        raise anthropic.APIConnectionError(request=request) from httpx2.ConnectError("refused")
    except anthropic.APIConnectionError as refused:
        assert _judged(refused)["outcome"] == {"class": "retryable", "kind": "unavailable"}
    try:
        raise anthropic.APIConnectionError(request=request) from httpx2.ReadError("reset")
    except anthropic.APIConnectionError as reset:
        assert _judged(reset)["outcome"] == {"class": "indeterminate", "kind": "unknown_provider_acceptance"}
    response = httpx2.Response(200, request=request)
    validation = _judged(anthropic.APIResponseValidationError(response=response, body=None))
    assert validation == {"outcome": {"class": "non_retryable", "kind": "protocol_violation"}, "rule": "error_type"}
    assert _judged(anthropic.AnthropicError("not a request"))["rule"] == "unrecognized"


def test_require_no_retries() -> None:
    url = "http://127.0.0.1:9"
    rl_anthropic.require_no_retries(anthropic.Anthropic(api_key="test", base_url=url, max_retries=0))
    rl_anthropic.require_no_retries(anthropic.AsyncAnthropic(api_key="test", base_url=url, max_retries=0))
    for client in (
        anthropic.Anthropic(api_key="test", base_url=url),
        anthropic.Anthropic(api_key="test", base_url=url, max_retries=1),
        anthropic.AsyncAnthropic(api_key="test", base_url=url),
    ):
        with pytest.raises(retryledger.PolicyError) as info:
            rl_anthropic.require_no_retries(client)
        assert info.value.code == "retry_owner_not_harness"
