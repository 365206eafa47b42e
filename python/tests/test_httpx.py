"""The httpx integration against fake providers on 127.0.0.1.

A scripted HTTP server answers the real ``httpx`` clients; the first path
segment names the route. For exercise 7 the retrying layer is httpx's own
``HTTPTransport(retries=2)``, which retries failed connections: against a
server that hangs up every TLS handshake, a naive three-attempt harness makes
it count 3 x 3 = 9 connections for one logical call; the integration refuses
that client; with the transport's retries off the count is the policy's bound.
"""

from __future__ import annotations

import hashlib

import asyncio
from typing import Any, Dict, Iterator, List

import httpx
import pytest

import retryledger
import retryledger.httpx as rl_httpx
from retryledger import Step

from conftest import KEY, make_policy
from loopback import HangUpServer, Reply, ScriptedServer, closed_port

JOB = {"job": "INC-4471", "severity": "high"}


def body(status: int) -> Any:
    return JOB if status == 200 else {"error": f"status {status}"}


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ScriptedServer] = []

    def start(scripts: Dict[str, List[Reply]]) -> ScriptedServer:
        servers.append(ScriptedServer(scripts, body).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def hang_up() -> Iterator[HangUpServer]:
    server = HangUpServer()
    try:
        yield server
    finally:
        server.stop()


def policy(**overrides: Any) -> Dict[str, Any]:
    document = make_policy(backoff={"base_ms": 10, "max_ms": 50, "retry_after_cap_ms": 2_000}, max_total_attempts=3)
    document.update(overrides)
    return document


def routes(primary: str, fallback: str) -> Dict[str, str]:
    return {"private-primary": primary, "external-fallback": fallback}


def poster(urls: Dict[str, str]) -> Any:
    def post(client: httpx.Client, step: Step) -> httpx.Response:
        return client.post(f"{urls[step.route_id]}/v1/jobs", json={"incident": "INC-4471"})

    return post


def async_poster(urls: Dict[str, str]) -> Any:
    async def post(client: httpx.AsyncClient, step: Step) -> httpx.Response:
        return await client.post(f"{urls[step.route_id]}/v1/jobs", json={"incident": "INC-4471"})

    return post


def outcomes(result: retryledger.RunResult[Any]) -> List[Dict[str, Any]]:
    return [a["outcome"] for a in result.bundle["attempts"]["attempts"]]


def test_success_returns_the_response(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]})
    with httpx.Client() as client:
        result = rl_httpx.run(policy(), client, poster(routes(server.url("primary"), server.url("fallback"))), KEY)
    assert result.value.status_code == 200
    assert result.value.json() == JOB
    assert [r.path for r in server.requests] == ["/primary/v1/jobs"]
    assert server.requests[0].idempotency_key == KEY
    assert outcomes(result) == [{"class": "success"}]
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"


def test_rate_limited_then_success_waits_for_the_hint_with_one_key(serve: Any) -> None:
    server = serve({"primary": [(429, {"Retry-After": "1", "retry-after-ms": "150"}), (200, {})], "fallback": [(200, {})]})
    with httpx.Client() as client:
        result = rl_httpx.run(policy(), client, poster(routes(server.url("primary"), server.url("fallback"))), KEY)
    assert result.value.json() == JOB
    assert [r.route for r in server.requests] == ["primary", "primary"]
    assert {r.idempotency_key for r in server.requests} == {KEY}
    assert server.requests[1].arrived - server.replied[0] >= 0.150
    sent = [a["request_body_sha256"] for a in result.bundle["attempts"]["attempts"]]
    assert sent == [hashlib.sha256(r.body).hexdigest() for r in server.requests]
    assert len(server.requests[0].body) > 0 and sent[0] == sent[1]
    assert outcomes(result) == [
        {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 150},
        {"class": "success"},
    ]


def test_unavailable_then_the_fallback_route_with_a_client_per_route(serve: Any) -> None:
    server = serve({"primary": [(503, {"retry-after-ms": "20"})], "fallback": [(200, {})]})
    urls = routes(server.url("primary"), server.url("fallback"))
    with httpx.Client() as primary, httpx.Client() as fallback:
        result = rl_httpx.run(policy(), routes_of(primary, fallback), poster(urls), KEY)
    assert result.value.json() == JOB
    assert [r.route for r in server.requests] == ["primary", "primary", "fallback"]
    assert {r.idempotency_key for r in server.requests} == {KEY}
    assert server.requests[1].arrived - server.replied[0] >= 0.020
    assert outcomes(result)[:2] == [{"class": "retryable", "kind": "unavailable", "retry_after_ms": 20}] * 2
    assert result.receipt["fallback_used"] is True


def test_a_route_without_a_client_is_refused_before_any_request(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]})
    urls = routes(server.url("primary"), server.url("fallback"))
    with httpx.Client() as primary:
        with pytest.raises(KeyError, match=r"httpx client: no client for route\(s\) external-fallback"):
            rl_httpx.run(policy(), {"private-primary": primary}, poster(urls), KEY)
    assert server.requests == []


def routes_of(primary: httpx.Client, fallback: httpx.Client) -> Dict[str, httpx.Client]:
    return {"private-primary": primary, "external-fallback": fallback}


def test_a_bad_request_stops_without_retry(serve: Any) -> None:
    server = serve({"primary": [(400, {})], "fallback": [(200, {})]})
    with httpx.Client() as client, pytest.raises(retryledger.RunStoppedError) as info:
        rl_httpx.run(policy(), client, poster(routes(server.url("primary"), server.url("fallback"))), KEY)
    assert server.count() == 1
    cause = info.value.__cause__
    assert isinstance(cause, httpx.HTTPStatusError)
    assert cause.response.status_code == 400
    attempts = info.value.bundle["attempts"]["attempts"]
    assert [a["outcome"] for a in attempts] == [{"class": "non_retryable", "kind": "invalid_request"}]


def test_connection_refused_is_unavailable_and_falls_back(serve: Any) -> None:
    server = serve({"fallback": [(200, {})]})
    urls = routes(f"http://127.0.0.1:{closed_port()}/primary", server.url("fallback"))
    with httpx.Client() as client:
        result = rl_httpx.run(policy(), client, poster(urls), KEY)
    assert outcomes(result)[:2] == [{"class": "retryable", "kind": "unavailable"}] * 2
    assert server.count("fallback") == 1


def test_the_key_and_the_deadline_are_stamped_on_every_request_of_an_attempt(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]})
    url = server.url("primary")
    seen: List[httpx.Request] = []

    def send(client: httpx.Client, step: Step) -> httpx.Response:
        client.get(f"{url}/v1/first", headers={"Idempotency-Key": "another"}, timeout=60.0)
        response = client.send(client.build_request("POST", f"{url}/v1/second", timeout=0.5))
        seen.extend([response.request])
        return response

    with httpx.Client(timeout=30.0) as client:
        result = rl_httpx.run(policy(deadline_ms=5_000), client, send, KEY)
        assert result.value.status_code == 200
        client.get(f"{url}/v1/outside")  # the hook does nothing outside a run
    assert [r.idempotency_key for r in server.requests] == [KEY, KEY, None]
    timeouts = seen[0].extensions["timeout"]
    assert timeouts["read"] == 0.5  # the shorter of the request's own and the remaining deadline
    assert 0 < timeouts["connect"] <= 5.0
    # The hook is added once, however often the client is used.
    with httpx.Client() as again:
        rl_httpx.run(policy(), again, lambda c, s: c.get(f"{url}/v1/x"), KEY)
        rl_httpx.run(policy(), again, lambda c, s: c.get(f"{url}/v1/y"), KEY)
        assert len(again.event_hooks["request"]) == 1


# ---- exercise 7: retries at two layers multiply ------------------------------


def hang_up_urls(server: HangUpServer) -> Dict[str, str]:
    url = f"https://127.0.0.1:{server.port}"
    return routes(url, url)


def test_naive_harness_over_a_retrying_transport_makes_nine_connections(hang_up: HangUpServer) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(retries=2)) as client:
        for _ in range(3):  # a naive harness: three attempts of its own
            try:
                client.post(f"https://127.0.0.1:{hang_up.port}/v1/jobs", json={})
                break
            except httpx.ConnectError:
                continue
    assert hang_up.connections == 9 == 3 * 3


def test_a_retrying_transport_is_refused_before_any_request(hang_up: HangUpServer) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(retries=2)) as client:
        with pytest.raises(retryledger.PolicyError) as info:
            rl_httpx.run(policy(), client, poster(hang_up_urls(hang_up)), KEY)
    assert info.value.code == "retry_owner_not_harness"
    mounted = httpx.Client(mounts={"https://": httpx.HTTPTransport(retries=1)})
    with pytest.raises(retryledger.PolicyError):
        rl_httpx.run(policy(), mounted, poster(hang_up_urls(hang_up)), KEY)
    mounted.close()
    async_client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(retries=2))
    with pytest.raises(retryledger.PolicyError):
        asyncio.run(rl_httpx.run_async(policy(), async_client, async_poster(hang_up_urls(hang_up)), KEY))
    asyncio.run(async_client.aclose())
    assert hang_up.connections == 0


def test_with_transport_retries_off_the_count_is_the_policy_bound(hang_up: HangUpServer) -> None:
    with httpx.Client(transport=httpx.HTTPTransport(retries=0)) as client:
        with pytest.raises(retryledger.RunStoppedError) as info:
            rl_httpx.run(policy(), client, poster(hang_up_urls(hang_up)), KEY)
    assert hang_up.connections == policy()["max_total_attempts"] == 3
    attempts = info.value.bundle["attempts"]["attempts"]
    assert [a["outcome"] for a in attempts] == [{"class": "retryable", "kind": "unavailable"}] * 3
    assert isinstance(info.value.__cause__, httpx.ConnectError)


# ---- async -------------------------------------------------------------------


def test_async_rate_limited_then_fallback(serve: Any) -> None:
    server = serve(
        {"primary": [(429, {"Retry-After": "1", "retry-after-ms": "150"}), (503, {"retry-after-ms": "20"})], "fallback": [(200, {})]}
    )
    urls = routes(server.url("primary"), server.url("fallback"))

    async def main() -> retryledger.RunResult[httpx.Response]:
        async with httpx.AsyncClient() as client:
            return await rl_httpx.run_async(policy(), client, async_poster(urls), KEY)

    result = asyncio.run(main())
    assert result.value.json() == JOB
    assert [r.route for r in server.requests] == ["primary", "primary", "fallback"]
    assert {r.idempotency_key for r in server.requests} == {KEY}
    assert server.requests[1].arrived - server.replied[0] >= 0.150
    assert outcomes(result)[:2] == [
        {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 150},
        {"class": "retryable", "kind": "unavailable", "retry_after_ms": 20},
    ]


def test_async_bad_request_stops_and_bound(serve: Any, hang_up: HangUpServer) -> None:
    server = serve({"primary": [(400, {})], "fallback": [(200, {})]})
    urls = routes(server.url("primary"), server.url("fallback"))

    async def main() -> None:
        async with httpx.AsyncClient() as client:
            with pytest.raises(retryledger.RunStoppedError):
                await rl_httpx.run_async(policy(), {"private-primary": client, "external-fallback": client}, async_poster(urls), KEY)
            with pytest.raises(retryledger.RunStoppedError):
                await rl_httpx.run_async(policy(), client, async_poster(hang_up_urls(hang_up)), KEY)

    asyncio.run(main())
    assert server.count() == 1
    assert hang_up.connections == 3


# ---- the core's judgement of httpx's exceptions ------------------------------


def _judged(exc: BaseException) -> Dict[str, Any]:
    return retryledger.judge(retryledger.facts_of(exc))


def _status_error(status: int, headers: Dict[str, str]) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/jobs")
    response = httpx.Response(status, headers=headers, request=request)
    try:
        response.raise_for_status()
    except httpx.HTTPStatusError as error:
        return error
    raise AssertionError("no error")


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (400, {"class": "non_retryable", "kind": "invalid_request"}),
        (401, {"class": "non_retryable", "kind": "rejected"}),
        (429, {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 2_000}),
        (503, {"class": "retryable", "kind": "unavailable", "retry_after_ms": 2_000}),
    ],
)
def test_status_errors_map_to_outcomes(status: int, outcome: Dict[str, Any]) -> None:
    assert _judged(_status_error(status, {"Retry-After": "2"})) == {"outcome": outcome, "rule": "status"}


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (httpx.ConnectError("refused"), {"class": "retryable", "kind": "unavailable"}),
        (httpx.ConnectTimeout("slow"), {"class": "retryable", "kind": "unavailable"}),
        (httpx.ReadTimeout("slow"), {"class": "retryable", "kind": "timeout_before_response"}),
        (httpx.ReadError("reset"), {"class": "indeterminate", "kind": "unknown_provider_acceptance"}),
        (httpx.RemoteProtocolError("eof"), {"class": "indeterminate", "kind": "unknown_provider_acceptance"}),
    ],
)
def test_transport_errors_map_to_outcomes(error: BaseException, outcome: Dict[str, Any]) -> None:
    assert _judged(error) == {"outcome": outcome, "rule": "transport"}


def test_require_no_retries() -> None:
    rl_httpx.require_no_retries(httpx.Client())
    rl_httpx.require_no_retries(httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(retries=0)))
    rl_httpx.require_no_retries(httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200))))
    for client in (
        httpx.Client(transport=httpx.HTTPTransport(retries=1)),
        httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(retries=3)),
    ):
        with pytest.raises(retryledger.PolicyError) as info:
            rl_httpx.require_no_retries(client)
        assert info.value.code == "retry_owner_not_harness"


def test_a_missing_route_client_is_refused() -> None:
    with httpx.Client() as client, pytest.raises(KeyError):
        rl_httpx.run(policy(), {"private-primary": client}, lambda c, s: c.get("http://127.0.0.1:9/"), KEY)
