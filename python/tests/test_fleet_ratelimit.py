"""Rate-limit headers observed on any response update the admission buckets
(docs/FLEET.md): against real loopback providers answering with OpenAI- and
Anthropic-style rate-limit headers, a response that says ``remaining`` 0 with
a reset empties the route's bucket until the reset, so the next run through
the same fleet store (memory, Redis) does not dispatch to that route before
the server said capacity returns; token reservations come from the request's
bound and are settled with the usage the response reports."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import anthropic
import openai
import pytest

import retryledger
import retryledger.anthropic as rl_anthropic
import retryledger.openai as rl_openai
from retryledger import RunStoppedError, Step
from retryledger.fleet import Fleet

from conftest import KEY, FakeClock, make_policy
from fleet_support import make_store, namespace
from loopback import Reply, ScriptedServer

EPOCH = 1_780_000_000_000
BACKENDS = ["memory", "redis"]


def completion_body(status: int) -> Any:
    if status != 200:
        return {"error": {"message": f"status {status}", "type": "rate_limit_error"}}
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 60, "total_tokens": 100},
    }  # fmt: skip


def message_body(status: int) -> Any:
    if status != 200:
        return {"type": "error", "error": {"type": "rate_limit_error", "message": f"status {status}"}}
    return {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "fake-model",
        "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 30, "output_tokens": 20},
    }  # fmt: skip


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ScriptedServer] = []

    def start(scripts: Dict[str, List[Reply]], body: Any) -> ScriptedServer:
        servers.append(ScriptedServer(scripts, body).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def limited(admission: Dict[str, Any]) -> retryledger.Policy:
    document = make_policy(
        fleet={"admission": admission, "on_store_unavailable": "fail_closed"},
        backoff={"base_ms": 10, "max_ms": 50, "retry_after_cap_ms": 60_000},
    )
    return retryledger.Policy(document)


def release_of(policy: retryledger.Policy, index: int = 0) -> str:
    return str(policy.document["routes"][index]["route_release_sha256"])


class Wall:
    """One fake clock for the run clock and the wall clock (``EPOCH`` + now)."""

    def __init__(self) -> None:
        self.clock = FakeClock()

    def epoch(self) -> int:
        return EPOCH + int(self.clock.now)

    def options(self) -> Dict[str, Any]:
        return {"clock": self.clock, "sleep": self.clock.sleep, "wall_clock": self.epoch}


def rfc3339(epoch_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def ask_openai(sent: List[int], wall: Wall) -> Any:
    def call(client: Any, step: Step) -> str:
        sent.append(wall.epoch())
        reply = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])
        return str(reply.choices[0].message.content)

    return call


def ask_anthropic(sent: List[int], wall: Wall) -> Any:
    def call(client: Any, step: Step) -> str:
        sent.append(wall.epoch())
        reply = client.messages.create(model="fake-model", max_tokens=64, messages=[{"role": "user", "content": "x"}])
        return str(reply.content[0].text)

    return call


def openai_clients(server: ScriptedServer) -> Dict[str, Any]:
    return {
        "private-primary": openai.OpenAI(api_key="t", base_url=server.url("primary") + "/v1", max_retries=0),
        "external-fallback": openai.OpenAI(api_key="t", base_url=server.url("fallback") + "/v1", max_retries=0),
    }


def anthropic_clients(server: ScriptedServer) -> Dict[str, Any]:
    return {
        "private-primary": anthropic.Anthropic(api_key="t", base_url=server.url("primary"), max_retries=0),
        "external-fallback": anthropic.Anthropic(api_key="t", base_url=server.url("fallback"), max_retries=0),
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_openai_success_with_remaining_zero_holds_the_next_run_until_the_reset(
    backend: str, serve: Any, tmp_path: Path
) -> None:
    server = serve(
        {"primary": [(200, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2.5s"}), (200, {})]},
        completion_body,
    )
    policy = limited({"max_queue_ms": 60_000, "request_burst": 5, "requests_per_second": 5})
    fleet = Fleet(make_store(backend, tmp_path), namespace=namespace())
    clients = openai_clients(server)
    wall = Wall()
    sent: List[int] = []
    first = rl_openai.run(policy, clients, ask_openai(sent, wall), KEY, fleet=fleet, **wall.options())
    assert first.value == "ok" and server.count("primary") == 1
    released_at = wall.epoch()
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    # The server's reset, 2.5 s after the release: the bucket is empty until then.
    assert (snapshot["request_level_milli"], snapshot["requests_at_epoch_ms"]) == (0, released_at + 2_500)
    assert snapshot["in_flight"] == 0
    # A second run through the same store (a fresh fleet: nothing cached).
    again = Fleet(fleet.store, namespace=fleet.namespace)
    second = rl_openai.run(policy, clients, ask_openai(sent, wall), KEY, fleet=again, **wall.options())
    assert second.value == "ok" and server.count("primary") == 2
    # Dispatched once the bucket refilled one request after the reset (5 per second: 200 ms).
    assert sent[1] >= released_at + 2_500
    limits = second.bundle["attempts"]["attempts"][0]["admission"]["limits"]
    assert limits["start_epoch_ms"] == released_at + 2_700
    # Asked when the first run ended (the fake clock stood still since).
    assert limits["queue_wait_ms"] == 2_700
    assert retryledger.verify_bundle(second.bundle)["kind"] == "verified"


@pytest.mark.parametrize("backend", BACKENDS)
def test_anthropic_429_with_an_rfc3339_reset_holds_every_retry_until_then(
    backend: str, serve: Any, tmp_path: Path
) -> None:
    reset = EPOCH + 3_000
    limits_headers = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": rfc3339(reset),
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": rfc3339(reset - 1_000),
    }
    server = serve({"primary": [(429, limits_headers), (200, {})], "fallback": [(200, {})]}, message_body)
    # A request bucket only: the token headers have no bucket to lower, and
    # a token reset without a token bucket still holds the route.
    policy = limited({"max_in_flight": 4, "max_queue_ms": 60_000, "request_burst": 2, "requests_per_second": 10})
    fleet = Fleet(make_store(backend, tmp_path), namespace=namespace())
    wall = Wall()
    sent: List[int] = []
    result = rl_anthropic.run(policy, anthropic_clients(server), ask_anthropic(sent, wall), KEY, fleet=fleet, **wall.options())
    assert result.value == "ok"
    # The 429 was answered at EPOCH; the retry on the same route waited for the reset.
    assert server.count("primary") == 2 and server.count("fallback") == 0
    assert sent[0] == EPOCH and sent[1] >= reset
    attempts = result.bundle["attempts"]["attempts"]
    assert attempts[1]["admission"]["limits"]["start_epoch_ms"] == reset + 100
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None and snapshot["in_flight"] == 0
    assert retryledger.verify_bundle(result.bundle)["kind"] == "verified"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reset_beyond_the_queue_bound_stops_the_next_run_before_dispatch(
    backend: str, serve: Any, tmp_path: Path
) -> None:
    server = serve(
        {"primary": [(200, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"})]},
        completion_body,
    )
    policy = limited({"max_queue_ms": 5_000, "request_burst": 5, "requests_per_second": 5})
    fleet = Fleet(make_store(backend, tmp_path), namespace=namespace())
    wall = Wall()
    sent: List[int] = []
    rl_openai.run(policy, openai_clients(server), ask_openai(sent, wall), KEY, fleet=fleet, **wall.options())
    with pytest.raises(RunStoppedError) as stopped:
        rl_openai.run(policy, openai_clients(server), ask_openai(sent, wall), KEY, fleet=fleet, **wall.options())
    assert stopped.value.terminal == "stop_admission"
    assert server.count("primary") == 1 and len(sent) == 1


def test_garbage_rate_limit_headers_leave_the_bucket_alone(serve: Any) -> None:
    server = serve(
        {"primary": [(200, {"x-ratelimit-remaining-requests": "lots", "x-ratelimit-reset-requests": "soon"})]},
        completion_body,
    )
    policy = limited({"max_queue_ms": 5_000, "request_burst": 5, "requests_per_second": 5})
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    wall = Wall()
    rl_openai.run(policy, openai_clients(server), ask_openai([], wall), KEY, fleet=fleet, **wall.options())
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    # One request taken and nothing else: the garbage was ignored.
    assert (snapshot["request_level_milli"], snapshot["in_flight"]) == (4_000, 0)


def test_tokens_reserved_from_the_request_bound_and_settled_with_the_usage(serve: Any) -> None:
    server = serve({"primary": [(200, {"x-ratelimit-remaining-tokens": "9950"})]}, completion_body)
    policy = limited({"max_queue_ms": 5_000, "token_bound": 10_000, "tokens_per_second": 1})
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    params = {"model": "fake-model", "max_completion_tokens": 500, "messages": [{"role": "user", "content": "x"}]}
    reserve = retryledger.request_token_bound(params, input_tokens=100)
    assert reserve == 600
    # Without a count, a quarter of the request's JSON length.
    assert retryledger.request_token_bound(params) == 500 + -(-len(json.dumps(params)) // 4)
    wall = Wall()

    def call(client: Any, step: Step) -> Any:
        # The SDK's response: the integration reads its usage.
        return client.chat.completions.create(**params)

    result = rl_openai.run(
        policy, openai_clients(server), call, KEY, fleet=fleet, reserve_tokens=reserve, **wall.options()
    )
    assert result.bundle["attempts"]["attempts"][0]["admission"]["limits"]["tokens"] == 600
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    # 600 reserved, 100 used (the usage's total): 9,900 left; the server's
    # 9,950 remaining is above it and never raises it.
    assert snapshot["token_level_milli"] == 9_900_000
    with pytest.raises(ValueError, match="no output bound"):
        retryledger.request_token_bound({"messages": []})


def test_tokens_settle_without_rate_limit_headers(serve: Any) -> None:
    server = serve({"primary": [(200, {})]}, message_body)
    policy = limited({"max_queue_ms": 5_000, "token_bound": 10_000, "tokens_per_second": 1})
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    wall = Wall()
    params = {"model": "fake-model", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
    reserve = retryledger.request_token_bound(params, input_tokens=36)

    def call(client: Any, step: Step) -> Any:
        return client.messages.create(**params)

    rl_anthropic.run(policy, anthropic_clients(server), call, KEY, fleet=fleet, reserve_tokens=reserve, **wall.options())
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    # 100 reserved, 50 used (30 in, 20 out): 9,950 left.
    assert snapshot["token_level_milli"] == 9_950_000


def test_the_core_applies_headers_in_the_release_and_keeps_digests_without_them() -> None:
    policy = limited({"max_queue_ms": 5_000, "request_burst": 2, "requests_per_second": 10})
    config = json.dumps(policy.document["fleet"]["admission"])
    snapshot = {
        "generation": 0, "in_flight": 0, "request_level_milli": 2000, "requests_at_epoch_ms": EPOCH,
        "route_release_sha256": release_of(policy), "schema": "retryledger.admission.v1",
        "token_level_milli": 0, "tokens_at_epoch_ms": EPOCH, "updated_at_epoch_ms": EPOCH,
    }  # fmt: skip
    same = retryledger.admission_observe(config, snapshot, [("content-type", "text/plain")], EPOCH)
    assert same == {"snapshot": snapshot}
    seen = retryledger.admission_observe(config, snapshot, {"RateLimit": '"default";r=0;t=30'}, EPOCH)
    assert seen["snapshot"]["requests_at_epoch_ms"] == EPOCH + 30_000
    far = retryledger.admission_observe(
        config, snapshot, [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "999h")], EPOCH
    )
    assert far["notes"] == ["reset_too_far"]


def test_a_stream_s_usage_settles_its_reservation() -> None:
    from sse_loopback import SSEServer, pieces_of

    document = make_policy(
        stream={"mode": "tentative", "max_response_bytes": 65536},
        fleet={
            "admission": {"max_queue_ms": 5_000, "token_bound": 10_000, "tokens_per_second": 1},
            "on_store_unavailable": "fail_closed",
        },
    )
    policy = retryledger.Policy(document)
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    params = {"model": "gpt-fake", "max_completion_tokens": 100, "messages": [{"role": "user", "content": "x"}]}
    with SSEServer({"private-primary": [{}]}) as server:
        clients = {
            r: openai.OpenAI(base_url=server.url(r), api_key="k", max_retries=0)
            for r in ("private-primary", "external-fallback")
        }
        run = rl_openai.stream_chat_completions(
            policy, clients, params, KEY, fleet=fleet, wall_clock=lambda: EPOCH,
            reserve_tokens=retryledger.request_token_bound(params, input_tokens=20),
        )  # fmt: skip
        events = list(run)
    assert run.terminal == "completed" and events[-1].kind == "commit"
    assert run.bundle["attempts"]["attempts"][0]["admission"]["limits"]["tokens"] == 120
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    # 120 reserved; the loopback's usage: 12 prompt tokens and one completion
    # token per piece of its text, all settled.
    assert snapshot["token_level_milli"] == (10_000 - 12 - len(pieces_of({}))) * 1000


def test_google_genai_usage_settles_a_reservation_from_the_config_bound(serve: Any) -> None:
    from google import genai
    from google.genai import types as genai_types

    import retryledger.google_genai as rl_google

    generated = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 30, "candidatesTokenCount": 12, "totalTokenCount": 42},
    }
    server = serve({"primary": [(200, {})]}, lambda status: generated)
    clients = {
        route: genai.Client(
            api_key="t", http_options=genai_types.HttpOptions(base_url=server.url(name), api_version="v1beta")
        )
        for route, name in (("private-primary", "primary"), ("external-fallback", "fallback"))
    }
    policy = limited({"max_queue_ms": 5_000, "token_bound": 10_000, "tokens_per_second": 1})
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    config = genai_types.GenerateContentConfig(max_output_tokens=200)
    reserve = retryledger.request_token_bound({"contents": "x", "config": config}, input_tokens=50)
    assert reserve == 250

    def call(client: Any, options: Any, step: Step) -> Any:
        # The SDK's response: the integration reads its usage_metadata.
        return client.models.generate_content(
            model="gemini-2.0-flash", contents="x", config=config.model_copy(update={"http_options": options})
        )

    wall = Wall()
    rl_google.run(policy, clients, call, KEY, fleet=fleet, reserve_tokens=reserve, **wall.options())
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    # 250 reserved, 42 used (totalTokenCount).
    assert snapshot["token_level_milli"] == (10_000 - 42) * 1000


def test_httpx_integration_reads_the_ietf_ratelimit_field(serve: Any) -> None:
    import httpx

    import retryledger.httpx as rl_httpx

    server = serve({"primary": [(200, {"RateLimit": '"default";r=0;t=2', "RateLimit-Policy": '"default";q=10;w=60'})]}, completion_body)
    policy = limited({"max_in_flight": 2, "max_queue_ms": 5_000})
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    wall = Wall()

    def post(client: httpx.Client, step: Step) -> httpx.Response:
        return client.post("/primary/v1/chat/completions", json={})

    with httpx.Client(base_url=server.base()) as client:
        rl_httpx.run(policy, client, post, KEY, fleet=fleet, **wall.options())
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    # No request bucket configured: the reset still holds the route for 2 s.
    assert (snapshot["requests_at_epoch_ms"], snapshot["in_flight"]) == (wall.epoch() + 2_000, 0)


def test_async_openai_client_s_response_hook_records_the_headers(serve: Any) -> None:
    import asyncio

    server = serve(
        {"primary": [(200, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"})]},
        completion_body,
    )
    policy = limited({"max_queue_ms": 60_000, "request_burst": 5, "requests_per_second": 5})
    fleet = Fleet(make_store("memory", Path(".")), namespace=namespace())
    clients = {
        "private-primary": openai.AsyncOpenAI(api_key="t", base_url=server.url("primary") + "/v1", max_retries=0),
        "external-fallback": openai.AsyncOpenAI(api_key="t", base_url=server.url("fallback") + "/v1", max_retries=0),
    }
    wall = Wall()

    async def call(client: Any, step: Step) -> Any:
        return await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])

    async def sleep(ms: float) -> None:
        wall.clock.sleep(ms)

    async def main() -> Any:
        return await rl_openai.run_async(
            policy, clients, call, KEY, fleet=fleet, clock=wall.clock, sleep=sleep, wall_clock=wall.epoch
        )

    asyncio.run(main())
    snapshot = fleet.admission(policy, release_of(policy))
    assert snapshot is not None
    assert (snapshot["request_level_milli"], snapshot["requests_at_epoch_ms"]) == (0, wall.epoch() + 1_000)
