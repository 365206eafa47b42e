"""The openai integration against a fake provider: a real HTTP server on 127.0.0.1.

Scripted: the primary answers 429 (Retry-After: 1, retry-after-ms: 150), then
503 (retry-after-ms: 20) for ever; the fallback answers 200. The SDK's default
client (max_retries=2) under a naive three-attempt harness makes the server
count 3 x 3 = 9 requests for one logical call; under retryledger the count
never exceeds the policy's bound, every request carries the same
Idempotency-Key, and none arrives before its Retry-After.
"""

from __future__ import annotations

import hashlib

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx2
import openai
import pytest

import retryledger
import retryledger.openai as rl_openai
from retryledger import Step

from conftest import KEY, make_policy

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "fake-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "severity: high"}, "finish_reason": "stop"}],
}

Reply = Tuple[int, Dict[str, str]]


class Request:
    def __init__(self, route: str, arrived: float, idempotency_key: Optional[str], body: bytes = b"") -> None:
        self.route = route
        self.arrived = arrived
        self.idempotency_key = idempotency_key
        #: The request body as received.
        self.body = body


class FakeProvider:
    """A scripted provider; each route answers its script in order, repeating the last reply."""

    def __init__(self, scripts: Dict[str, List[Reply]]) -> None:
        self.scripts = scripts
        self.requests: List[Request] = []
        self.replied: List[float] = []  # when each reply was sent, in request order
        self.lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                received = self.rfile.read(length)
                route = self.path.split("/")[1]
                with provider.lock:
                    index = sum(1 for r in provider.requests if r.route == route)
                    provider.requests.append(Request(route, arrived, self.headers.get("Idempotency-Key"), received))
                    script = provider.scripts[route]
                    status, headers = script[min(index, len(script) - 1)]
                body = json.dumps(COMPLETION if status == 200 else {"error": {"message": f"status {status}"}})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body.encode())
                self.wfile.flush()
                with provider.lock:
                    provider.replied.append(time.monotonic())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    def url(self, route: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/{route}/v1"

    def count(self, route: Optional[str] = None) -> int:
        return sum(1 for r in self.requests if route is None or r.route == route)


SCRIPT: Dict[str, List[Reply]] = {
    "primary": [(429, {"Retry-After": "1", "retry-after-ms": "150"}), (503, {"retry-after-ms": "20"})],
    "fallback": [(200, {})],
}


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    p = FakeProvider(SCRIPT)
    p.thread.start()
    try:
        yield p
    finally:
        p.server.shutdown()
        p.server.server_close()


def openai_policy() -> Dict[str, Any]:
    policy = make_policy(
        backoff={"base_ms": 10, "max_ms": 50, "retry_after_cap_ms": 2_000},
        max_total_attempts=3,
    )
    return policy


def ask(client: Any, step: Optional[Step] = None) -> str:
    reply = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "INC-4471"}])
    content: str = reply.choices[0].message.content
    return content


def test_naive_harness_over_the_default_client_sends_nine_requests(provider: FakeProvider) -> None:
    client = openai.OpenAI(api_key="test", base_url=provider.url("primary"))  # max_retries=2 by default
    for _ in range(3):  # a naive harness: three attempts of its own
        try:
            ask(client)
            break
        except openai.APIError:
            continue
    assert provider.count() == 9 == 3 * 3


def test_a_route_without_a_client_is_refused_before_any_request(provider: FakeProvider) -> None:
    only_primary = {"private-primary": openai.OpenAI(api_key="test", base_url=provider.url("primary"), max_retries=0)}
    with pytest.raises(KeyError, match=r"openai client: no client for route\(s\) external-fallback"):
        rl_openai.run(openai_policy(), only_primary, ask, KEY)
    assert provider.count() == 0


def test_integration_stays_within_the_bound_with_one_key_and_no_early_request(provider: FakeProvider) -> None:
    policy = retryledger.Policy(openai_policy())
    clients = {
        "private-primary": openai.OpenAI(api_key="test", base_url=provider.url("primary"), max_retries=0),
        "external-fallback": openai.OpenAI(api_key="test", base_url=provider.url("fallback"), max_retries=0),
    }
    result = rl_openai.run(policy, clients, ask, KEY)
    assert result.value == "severity: high"
    bound = policy.document["max_total_attempts"]
    assert provider.count() <= bound
    assert [r.route for r in provider.requests] == ["primary", "primary", "fallback"]
    assert {r.idempotency_key for r in provider.requests} == {KEY}
    # No request before its Retry-After: the retry came at least 150 ms after the 429 was sent.
    assert provider.requests[1].arrived - provider.replied[0] >= 0.150
    assert provider.requests[2].arrived - provider.replied[1] >= 0.020
    outcomes = [a["outcome"] for a in result.bundle["attempts"]["attempts"]]
    assert outcomes == [
        {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 150},
        {"class": "retryable", "kind": "unavailable", "retry_after_ms": 20},
        {"class": "success"},
    ]
    assert result.receipt["fallback_used"] is True
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"
    # Each attempt records the SHA-256 of the body the server received.
    sent = [a["request_body_sha256"] for a in result.bundle["attempts"]["attempts"]]
    assert sent == [hashlib.sha256(r.body).hexdigest() for r in provider.requests]
    assert sent[0] == sent[1]


def test_async_integration(provider: FakeProvider) -> None:
    clients = {
        "private-primary": openai.AsyncOpenAI(api_key="test", base_url=provider.url("primary"), max_retries=0),
        "external-fallback": openai.AsyncOpenAI(api_key="test", base_url=provider.url("fallback"), max_retries=0),
    }

    async def ask_async(client: Any, step: Step) -> str:
        reply = await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
        content: str = reply.choices[0].message.content
        return content

    result = asyncio.run(rl_openai.run_async(openai_policy(), clients, ask_async, KEY))
    assert result.value == "severity: high"
    assert provider.count() == 3
    assert {r.idempotency_key for r in provider.requests} == {KEY}


def test_a_client_that_retries_is_refused_before_any_request(provider: FakeProvider) -> None:
    clients = {
        "private-primary": openai.OpenAI(api_key="test", base_url=provider.url("primary")),
        "external-fallback": openai.OpenAI(api_key="test", base_url=provider.url("fallback"), max_retries=0),
    }
    with pytest.raises(retryledger.PolicyError) as info:
        rl_openai.run(openai_policy(), clients, ask, KEY)
    assert info.value.code == "retry_owner_not_harness"
    assert provider.count() == 0


def test_connection_refused_is_unavailable_and_falls_back(provider: FakeProvider) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()  # nothing listens there now
    clients = {
        "private-primary": openai.OpenAI(api_key="test", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0),
        "external-fallback": openai.OpenAI(api_key="test", base_url=provider.url("fallback"), max_retries=0),
    }
    result = rl_openai.run(openai_policy(), clients, ask, KEY)
    outcomes = [a["outcome"] for a in result.bundle["attempts"]["attempts"]]
    assert outcomes[:2] == [{"class": "retryable", "kind": "unavailable"}] * 2
    assert provider.count("fallback") == 1


def _status_error(cls: Any, status: int, headers: Optional[Dict[str, str]] = None) -> Any:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(status, headers=headers or {}, request=request)
    return cls(f"status {status}", response=response, body=None)


def _judged(exc: BaseException) -> Dict[str, Any]:
    """The core's judgement of the facts a driver reads off an SDK exception."""
    return retryledger.judge(retryledger.facts_of(exc))


@pytest.mark.parametrize(
    ("cls", "status", "outcome"),
    [
        (openai.BadRequestError, 400, {"class": "non_retryable", "kind": "invalid_request"}),
        (openai.AuthenticationError, 401, {"class": "non_retryable", "kind": "rejected"}),
        (openai.PermissionDeniedError, 403, {"class": "non_retryable", "kind": "policy_denied"}),
        (openai.NotFoundError, 404, {"class": "non_retryable", "kind": "invalid_request"}),
        (openai.ConflictError, 409, {"class": "non_retryable", "kind": "rejected"}),
        (openai.UnprocessableEntityError, 422, {"class": "non_retryable", "kind": "invalid_request"}),
        (openai.RateLimitError, 429, {"class": "retryable", "kind": "rate_limited"}),
        (openai.InternalServerError, 500, {"class": "retryable", "kind": "unavailable"}),
        (openai.InternalServerError, 503, {"class": "retryable", "kind": "unavailable"}),
    ],
)
def test_status_errors_map_to_outcomes(cls: Any, status: int, outcome: Dict[str, Any]) -> None:
    judgement = _judged(_status_error(cls, status))
    assert judgement == {"outcome": outcome, "rule": "status"}


def test_rate_limit_hints() -> None:
    seconds = _judged(_status_error(openai.RateLimitError, 429, {"retry-after": "2"}))
    millis = _judged(_status_error(openai.RateLimitError, 429, {"retry-after": "2", "retry-after-ms": "250.5"}))
    garbage = _judged(_status_error(openai.RateLimitError, 429, {"retry-after": "soon"}))
    assert seconds["outcome"]["retry_after_ms"] == 2_000
    assert millis["outcome"]["retry_after_ms"] == 251
    assert "retry_after_ms" not in garbage["outcome"]


def test_transport_errors_map_to_outcomes() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    timeout = _judged(openai.APITimeoutError(request=request))
    assert timeout == {"outcome": {"class": "retryable", "kind": "timeout_before_response"}, "rule": "transport"}
    try:
        raise openai.APIConnectionError(request=request) from httpx2.ConnectError("refused")
    except openai.APIConnectionError as refused:
        assert _judged(refused)["outcome"] == {"class": "retryable", "kind": "unavailable"}
    try:
        raise openai.APIConnectionError(request=request) from httpx2.ReadError("reset")
    except openai.APIConnectionError as reset:
        assert _judged(reset)["outcome"] == {"class": "indeterminate", "kind": "unknown_provider_acceptance"}
    response = httpx2.Response(200, request=request)
    validation = openai.APIResponseValidationError(response=response, body=None)
    assert _judged(validation) == {"outcome": {"class": "non_retryable", "kind": "protocol_violation"}, "rule": "error_type"}
    assert _judged(ValueError("not openai"))["rule"] == "unrecognized"


def test_require_no_retries() -> None:
    rl_openai.require_no_retries(openai.OpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0))
    with pytest.raises(retryledger.PolicyError):
        rl_openai.require_no_retries(openai.OpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=1))
