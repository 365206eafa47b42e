"""retryledger.openai.run_hedged_async with the real ``openai`` package
(``AsyncOpenAI``, ``max_retries=0``) against a fake provider on 127.0.0.1
whose primary route answers every other request after SLOW_MS: the hedge on
the fallback wins those calls, the slow lead's request is cancelled (the
provider sees its connection closed), every request carries the run's
Idempotency-Key, and a client with SDK retries is refused before any
request."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

import openai
import pytest

import retryledger
import retryledger.openai as rl_openai
from retryledger.hedge import HedgeAttempt

from conftest import KEY
from test_hedge import hedged_policy

SLOW_MS = 300


class TailProvider:
    """Chat completions on 127.0.0.1: ``/primary`` answers after SLOW_MS while ``slow`` is set."""

    def __init__(self) -> None:
        self.slow = False
        self.log: List[Dict[str, Any]] = []
        self.lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                route = self.path.split("/")[1]
                with provider.lock:
                    entry: Dict[str, Any] = {"route": route, "key": self.headers.get("Idempotency-Key"), "closed": False}
                    provider.log.append(entry)
                delay = SLOW_MS if route == "primary" and provider.slow else 3
                until = time.monotonic() + delay / 1000
                while (left := until - time.monotonic()) > 0:
                    readable, _, _ = select.select([self.connection], [], [], min(left, 0.005))
                    if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                        entry["closed"] = True
                        self.close_connection = True
                        return
                body = json.dumps(
                    {
                        "id": f"chatcmpl-{route}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "fake-model",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": route}, "finish_reason": "stop"}],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{route}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


async def ask(client: Any, a: HedgeAttempt) -> Any:
    return await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])


def test_the_hedge_wins_the_slow_calls_and_the_slow_lead_is_cancelled() -> None:
    provider = TailProvider()

    async def scenario() -> None:
        clients = {
            "private-primary": openai.AsyncOpenAI(api_key="test", base_url=provider.url("primary"), max_retries=0),
            "external-fallback": openai.AsyncOpenAI(api_key="test", base_url=provider.url("fallback"), max_retries=0),
        }
        # A first call opens the clients' connections.
        await rl_openai.run_hedged_async(hedged_policy(), clients, ask, KEY)
        provider.log.clear()
        winners = []
        for slow in (False, True, False, True):
            provider.slow = slow
            run = await rl_openai.run_hedged_async(hedged_policy(), clients, ask, KEY)
            assert run.terminal == "completed"
            assert run.result is not None
            summary = run.receipt["hedge"]
            winner = next(a for a in run.bundle["attempts"]["attempts"] if a["ordinal"] == summary["winner_ordinal"])
            assert run.result.choices[0].message.content == ("primary" if winner["route_id"] == "private-primary" else "fallback")
            assert run.result.choices[0].message.content is not None
            winners.append(winner["route_id"])
            assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"
        # The primary answers the fast calls; the slow ones are won by the hedge.
        assert winners == ["private-primary", "external-fallback", "private-primary", "external-fallback"]
        for _ in range(200):
            if sum(1 for e in provider.log if e["closed"] and e["route"] == "primary") >= 2:
                break
            await asyncio.sleep(0.01)

    try:
        asyncio.run(scenario())
    finally:
        provider.close()
    assert all(e["key"] == KEY for e in provider.log)
    # The two slow leads were cancelled in flight: the provider saw their connections close.
    assert sum(1 for e in provider.log if e["closed"] and e["route"] == "primary") == 2, provider.log


def test_a_client_with_sdk_retries_is_refused_before_any_request() -> None:
    clients = {
        "private-primary": openai.AsyncOpenAI(api_key="test", base_url="http://127.0.0.1:9/v1"),
        "external-fallback": openai.AsyncOpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0),
    }
    with pytest.raises(retryledger.PolicyError) as e:
        asyncio.run(rl_openai.run_hedged_async(hedged_policy(), clients, ask, KEY))
    assert e.value.code == "retry_owner_not_harness"
