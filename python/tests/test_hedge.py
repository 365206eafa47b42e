"""run_hedged_async against a real loopback HTTP server whose latency has a
heavy tail: every fifth request on the primary route sleeps SLOW_MS, the
others answer in a few ms; the fallback (the hedge route, independent
capacity) answers in FALLBACK_MS. The same calls run without hedging
(run_async, the policy without its hedge section) and with it. Checked: the
run clock's p99 falls below the tail the server imposes on every unhedged
slow call; physical attempts (the server's count) stay within
1 + max_hedges per call and match the receipts' counts; every cancelled
loser is charged its route's reserve (cancelled_cost "reserve") and its
connection was closed before the server answered."""

from __future__ import annotations

import asyncio
import json
import math
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

import httpx
import pytest

import retryledger
from retryledger.hedge import HedgeAttempt, run_hedged_async

from conftest import KEY, make_policy

SLOW_MS = 400
FAST_MS = 4
FALLBACK_MS = 12
HEDGE_DELAY_MS = 50
CALLS = 30


class TailServer:
    """A loopback server with a heavy-tailed primary route; every request logged."""

    def __init__(self) -> None:
        self.log: List[Dict[str, Any]] = []
        self.counts: Dict[str, int] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in two writes: without this, Nagle's
                # algorithm and the client's delayed ACK add 40 ms to every reply.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                route = self.path.split("/")[1]
                with server.lock:
                    n = server.counts.get(route, 0)
                    server.counts[route] = n + 1
                    entry: Dict[str, Any] = {
                        "route": route,
                        "n": n,
                        "key": self.headers.get("Idempotency-Key"),
                        "aborted": False,
                    }
                    server.log.append(entry)
                delay = (SLOW_MS if n % 5 == 4 else FAST_MS) if route == "private-primary" else FALLBACK_MS
                until = time.monotonic() + delay / 1000
                while (left := until - time.monotonic()) > 0:
                    readable, _, _ = select.select([self.connection], [], [], min(left, 0.005))
                    if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                        entry["aborted"] = True
                        self.close_connection = True
                        return
                payload = json.dumps({"route": route, "n": n}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def hedged_policy() -> Dict[str, Any]:
    policy = make_policy(max_total_attempts=6)
    for r in policy["routes"]:
        r["max_attempts"] = 3
    policy["hedge"] = {
        "cancelled_cost": "reserve",
        "cost_share_percent": 50,
        "delay_ms": HEDGE_DELAY_MS,
        "effects": "none",
        "max_hedges": 1,
        "routes": ["external-fallback"],
    }
    return policy


def quantile(xs: List[int], q: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]


def test_hedging_cuts_the_p99_within_the_bound_losers_charged_and_closed() -> None:
    srv = TailServer()
    try:
        asyncio.run(_scenario(srv))
    finally:
        srv.close()


async def _scenario(srv: TailServer) -> None:
    hedged = hedged_policy()
    plain = hedged_policy()
    del plain["hedge"]
    reserve = {r["route_id"]: r["reserve_cost"] for r in hedged["routes"]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.port}") as client:

        async def get(route: str) -> Dict[str, Any]:
            r = await client.get(f"/{route}", headers={"Idempotency-Key": KEY})
            body: Dict[str, Any] = r.json()
            return body

        async def plain_dispatch(step: retryledger.Step) -> Dict[str, Any]:
            return await get(step.route_id)

        plain_latency: List[int] = []
        for _ in range(CALLS):
            plain_run = await retryledger.run_async(plain, plain_dispatch, KEY)
            assert plain_run.receipt["terminal"] == "completed"
            plain_latency.append(plain_run.receipt["finished_at_ms"])
        plain_requests = len(srv.log)
        assert plain_requests == CALLS

        async def hedged_dispatch(a: HedgeAttempt) -> Dict[str, Any]:
            assert a.idempotency_key == KEY
            return await get(a.route_id)

        hedged_latency: List[int] = []
        attempts = 0
        cancelled_losers = 0
        for _ in range(CALLS):
            run = await run_hedged_async(hedged, hedged_dispatch, KEY)
            assert run.terminal == "completed"
            receipt = run.receipt
            summary = receipt["hedge"]
            listed = {a["ordinal"]: a for a in run.bundle["attempts"]["attempts"]}
            winner = listed[summary["winner_ordinal"]]
            assert run.result is not None and run.result["route"] == winner["route_id"]
            assert receipt["attempt_count"] <= 1 + hedged["hedge"]["max_hedges"]
            assert receipt["attempt_count"] == run.attempts
            attempts += receipt["attempt_count"]
            schedule = receipt["schedule"]
            if len(schedule) > 1:
                assert schedule[1]["started_at_ms"] - schedule[0]["started_at_ms"] >= HEDGE_DELAY_MS
            for loser in summary["losers"]:
                if loser["reason"] == "cancelled":
                    assert loser["cost"] == reserve[listed[loser["ordinal"]]["route_id"]]
                    cancelled_losers += 1
            assert summary["loser_cost"] == sum(l["cost"] for l in summary["losers"])
            assert receipt["total_cost"] == sum(e["cost"] for e in schedule)
            assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"
            hedged_latency.append(receipt["finished_at_ms"])

    hedged_log = srv.log[plain_requests:]
    # Every request the server saw is an attempt a receipt counts; a hedge
    # cancelled before its request went out is counted (and charged) but unseen.
    assert attempts - cancelled_losers <= len(hedged_log) <= attempts
    assert all(e["key"] == KEY for e in hedged_log)
    slow_leads = sum(1 for e in hedged_log if e["route"] == "private-primary" and e["n"] % 5 == 4)
    assert slow_leads > 0
    assert cancelled_losers >= slow_leads, "every slow lead lost to its hedge and was cancelled"
    # The server notices a closed connection within its poll interval.
    for _ in range(200):
        if sum(1 for e in hedged_log if e["aborted"]) >= slow_leads:
            break
        await asyncio.sleep(0.01)
    aborted = sum(1 for e in hedged_log if e["aborted"])
    assert slow_leads <= aborted <= cancelled_losers, (aborted, cancelled_losers)
    # The tail falls: every unhedged slow call waited the server's SLOW_MS,
    # while the hedged calls' p99 is below the plain calls' on the same draws
    # (how far below is the bench's figure: a shared machine may stall a call).
    assert quantile(plain_latency, 0.99) >= SLOW_MS
    assert quantile(hedged_latency, 0.99) < quantile(plain_latency, 0.99), quantile(hedged_latency, 0.99)


def test_a_key_whose_digest_is_not_the_policys_is_refused_before_any_dispatch() -> None:
    calls = 0

    async def dispatch(a: HedgeAttempt) -> None:
        nonlocal calls
        calls += 1

    with pytest.raises(retryledger.DriftError) as e:
        asyncio.run(run_hedged_async(hedged_policy(), dispatch, "another key"))
    assert e.value.code == "idempotency_key_drift"
    assert calls == 0


def test_a_hedge_with_external_effects_is_refused_before_any_dispatch() -> None:
    policy = hedged_policy()
    policy["hedge"]["effects"] = "external"
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.HedgeSession(policy)
    assert e.value.code == "hedge_external_effects"


def test_a_lead_that_swallows_its_cancellation_cannot_hold_the_run() -> None:
    policy = hedged_policy()
    policy["hedge"]["delay_ms"] = 20
    release = asyncio.Event()

    async def dispatch(a: HedgeAttempt) -> str:
        if a.hedges is None:
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    pass  # a dispatch that ignores its cancellation
            return "too late"
        return f"hedge of {a.hedges}"

    async def scenario() -> None:
        run = await run_hedged_async(policy, dispatch, KEY)
        assert run.terminal == "completed"
        assert run.result == "hedge of 1"
        assert [(l["ordinal"], l["reason"]) for l in run.receipt["hedge"]["losers"]] == [(1, "cancelled")]
        release.set()
        await asyncio.sleep(0)
        assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"

    asyncio.run(scenario())
