"""A client timeout retried under the same key while the first request still
runs, end to end over loopback HTTP (127.0.0.1): the project's receiver guard
in front of a handler that holds the first request longer than the client's
timeout. The driver times out, is answered ``409`` with ``Retry-After``
(``idempotency_in_progress``), judges it ``in_progress``, waits the hint and
asks again on the same route (past the route's own bound of two attempts,
never on the fallback) with the same key and body, and completes with the
replayed answer (``Idempotent-Replayed: true``). The handler ran once.
The crash test's shape (a 3 s hold, a 1 s client timeout) at a smaller
scale."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, Iterator, List, Tuple

import httpx
import pytest

import retryledger
import retryledger.httpx as rl_httpx
from retryledger import Step
from retryledger.receiver import HttpResponse, IdempotencyGuard
from retryledger.stores import MemoryStore

from conftest import KEY, make_policy
from receiver_support import AsgiServer, DecoratedServer, Endpoint, Server

HOLD = 1.2  # the first request's work, seconds
CLIENT_TIMEOUT = 0.4  # the client gives up long before


class HeldEndpoint(Endpoint):
    """``/orders`` holds each run for :data:`HOLD` seconds, then answers 201."""

    def run(self, target: str, body: bytes) -> HttpResponse:
        with self.lock:
            self.runs.append((target, body))
            n = len(self.runs)
        time.sleep(HOLD)
        payload = json.dumps({"order": json.loads(body or b"null"), "run": n}).encode()
        return HttpResponse(201, [("Content-Type", "application/json")], payload)


class Fallback:
    """Counts what reaches the fallback route (nothing should)."""

    def __init__(self) -> None:
        self.hits = 0
        self.lock = threading.Lock()

    def transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            with self.lock:
                self.hits += 1
            return httpx.Response(201, json={"fallback": True})

        return httpx.MockTransport(handle)


@pytest.fixture(params=["asgi", "decorator"])
def served(request: pytest.FixtureRequest) -> Iterator[Tuple[Server, HeldEndpoint]]:
    """The guard (Retry-After 1 while in progress) in front of a held endpoint."""
    guard = IdempotencyGuard(MemoryStore(), retention={"expired": "reject", "poll_after_ms": 1_000, "ttl_ms": 60_000})
    endpoint = HeldEndpoint()
    front = AsgiServer if request.param == "asgi" else DecoratedServer
    s = front(guard, endpoint)
    yield s, endpoint
    s.close()


def policy() -> Dict[str, Any]:
    document = make_policy(
        backoff={"base_ms": 50, "max_ms": 200, "retry_after_cap_ms": 2_000},
        max_total_attempts=6,
        deadline_ms=10_000,
    )
    document["routes"][0]["max_attempts"] = 2
    return document


def outcomes(result: retryledger.RunResult[Any]) -> List[Dict[str, Any]]:
    return [a["outcome"] for a in result.bundle["attempts"]["attempts"]]


def test_a_timeout_then_409_in_progress_then_the_replay_completes_and_the_handler_ran_once(
    served: Tuple[Server, HeldEndpoint],
) -> None:
    server, endpoint = served
    fallback = Fallback()
    url = f"http://127.0.0.1:{server.port}/orders"

    def post(client: httpx.Client, step: Step) -> httpx.Response:
        return client.post(url, json={"sku": "A-1", "qty": 2})

    started = time.monotonic()
    with httpx.Client(timeout=CLIENT_TIMEOUT) as primary, httpx.Client(transport=fallback.transport()) as other:
        result = rl_httpx.run(policy(), {"private-primary": primary, "external-fallback": other}, post, KEY)
    elapsed = time.monotonic() - started
    assert result.value.status_code == 201
    assert result.value.headers["idempotent-replayed"] == "true"
    assert result.value.json() == {"order": {"qty": 2, "sku": "A-1"}, "run": 1}
    assert endpoint.count("/orders") == 1, "the handler ran once"
    assert fallback.hits == 0, "never asked another route"
    seen = outcomes(result)
    assert seen[0] == {"class": "retryable", "kind": "timeout_before_response"}
    assert seen[-1] == {"class": "success"}
    assert seen[1] == {"class": "retryable", "kind": "in_progress", "retry_after_ms": 1_000}
    assert all(o.get("kind") == "in_progress" for o in seen[1:-1])
    attempts = result.bundle["attempts"]["attempts"]
    assert {a["route_id"] for a in attempts} == {"private-primary"}
    assert [a["route_ordinal"] for a in attempts] == list(range(1, len(attempts) + 1))
    assert attempts[-1]["route_ordinal"] > 2, "asked past the route's bound"
    assert len({a["request_body_sha256"] for a in attempts}) == 1
    assert result.receipt["terminal"] == "completed"
    assert result.receipt["fallback_used"] is False
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"
    assert elapsed < 8

