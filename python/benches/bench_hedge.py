"""Hedging against a heavy-tailed loopback server: p50/p90/p99 latency (the
run clock's ``finished_at_ms``) and physical attempts per call, without
hedging (``retryledger.run_async``) and with it
(``retryledger.hedge.run_hedged_async``), side by side in one run.

The server (``ThreadingHTTPServer`` on 127.0.0.1, TCP_NODELAY) draws every
request's latency from one heavy-tailed mix on both routes: 93 % fast
(FAST_MS), 5 % slow (SLOW_MS), 2 % very slow (TAIL_MS), seeded by the call's
index, the route and the attempt's ordinal (headers the bench sends), so
call i meets the same server in both modes: the comparison is paired. The
hedge goes to the fallback after ``delay_ms`` without a result; losers are
cancelled. Calls alternate between the two modes.

    python python/benches/bench_hedge.py [--calls N] [--write docs/BENCHMARKS.md]

``--write`` replaces the text between ``<!-- python-hedge:begin -->`` and
``<!-- python-hedge:end -->`` when the file has those markers, and otherwise
leaves the file alone (the figures are printed either way).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import re
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List

import httpx

import retryledger
from retryledger.hedge import HedgeAttempt, run_hedged_async

KEY = "idempotency-key: tenant-7/op-summarize/INC-4471"
FAST_MS = 5
SLOW_MS = 120
TAIL_MS = 800
DELAY_MS = 25


class TailServer:
    """A loopback server whose latency has a heavy tail (seeded); it counts
    requests and the connections closed before their reply."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.lock = threading.Lock()
        self.requests = 0
        self.closed = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                with server.lock:
                    server.requests += 1
                key = f"{server.seed}/{self.headers.get('x-bench-call')}/{self.path}/{self.headers.get('x-bench-ordinal')}"
                u = random.Random(key).random()
                delay = TAIL_MS if u < 0.02 else SLOW_MS if u < 0.07 else FAST_MS
                until = time.monotonic() + delay / 1000
                while (left := until - time.monotonic()) > 0:
                    readable, _, _ = select.select([self.connection], [], [], min(left, 0.005))
                    if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                        with server.lock:
                            server.closed += 1
                        self.close_connection = True
                        return
                payload = b'{"ok":true}'
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
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def policies() -> tuple[Dict[str, Any], Dict[str, Any]]:
    policy: Dict[str, Any] = json.loads(json.dumps(retryledger.lab().report["baseline"]["policy"]))
    policy["max_total_attempts"] = 6
    for r in policy["routes"]:
        r["max_attempts"] = 3
    plain = json.loads(json.dumps(policy))
    policy["hedge"] = {
        "cancelled_cost": "reserve",
        "cost_share_percent": 50,
        "delay_ms": DELAY_MS,
        "effects": "none",
        "max_hedges": 1,
        "routes": ["external-fallback"],
    }
    return plain, policy


def q(xs: List[int], p: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]


async def bench(calls: int) -> Dict[str, Dict[str, float]]:
    plain, hedged = policies()
    compiled_plain = retryledger.Policy(plain)
    compiled_hedged = retryledger.Policy(hedged)
    srv = TailServer(seed=7)
    out: Dict[str, Dict[str, Any]] = {m: {"lat": [], "attempts": 0, "cost": 0, "seen": 0} for m in ("plain", "hedged")}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.port}") as client:

            call = 0

            async def get(route: str, ordinal: int) -> bool:
                headers = {"Idempotency-Key": KEY, "x-bench-call": str(call), "x-bench-ordinal": str(ordinal)}
                r = await client.get(f"/{route}", headers=headers)
                return r.status_code == 200

            async def plain_dispatch(step: retryledger.Step) -> bool:
                return await get(step.route_id, step.ordinal)

            async def hedged_dispatch(a: HedgeAttempt) -> bool:
                return await get(a.route_id, a.ordinal)

            for i in range(2 * calls):
                mode = "plain" if i % 2 == 0 else "hedged"
                call = i // 2
                before = srv.requests
                if mode == "plain":
                    run = await retryledger.run_async(compiled_plain, plain_dispatch, KEY)
                    receipt = run.receipt
                else:
                    h = await run_hedged_async(compiled_hedged, hedged_dispatch, KEY)
                    receipt = h.receipt
                    await asyncio.sleep(0.002)  # let a cancelled request reach the server's count
                o = out[mode]
                o["lat"].append(receipt["finished_at_ms"])
                o["attempts"] += receipt["attempt_count"]
                o["cost"] += receipt["total_cost"]
                o["seen"] += srv.requests - before
    finally:
        srv.close()
    figures: Dict[str, Dict[str, float]] = {}
    for mode, o in out.items():
        figures[mode] = {
            "p50": q(o["lat"], 0.50),
            "p90": q(o["lat"], 0.90),
            "p99": q(o["lat"], 0.99),
            "attempts": o["attempts"] / calls,
            "seen": o["seen"] / calls,
            "cost": o["cost"] / calls,
        }
    return figures


def table(f: Dict[str, Dict[str, float]], calls: int) -> str:
    p, h = f["plain"], f["hedged"]
    rows = [
        f"Python {platform.python_version()}, {calls} calls per mode, interleaved; server latency 93 % {FAST_MS} ms, "
        f"5 % {SLOW_MS} ms, 2 % {TAIL_MS} ms on both routes, the same draws for call i in both modes; hedge after {DELAY_MS} ms on the fallback.",
        "",
        "| | p50 | p90 | p99 | attempts per call | requests the server saw per call | cost per call |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| `run_async` (no hedging) | {p['p50']:.0f} ms | {p['p90']:.0f} ms | {p['p99']:.0f} ms | {p['attempts']:.2f} | {p['seen']:.2f} | {p['cost']:.0f} |",
        f"| `run_hedged_async` | {h['p50']:.0f} ms | {h['p90']:.0f} ms | {h['p99']:.0f} ms | {h['attempts']:.2f} | {h['seen']:.2f} | {h['cost']:.0f} |",
        f"| ratio (hedged / plain) | {h['p50'] / max(p['p50'], 1):.2f} | {h['p90'] / max(p['p90'], 1):.2f} | "
        f"{h['p99'] / max(p['p99'], 1):.2f} | {h['attempts'] / p['attempts']:.2f} | {h['seen'] / max(p['seen'], 1e-9):.2f} | "
        f"{h['cost'] / max(p['cost'], 1e-9):.2f} |",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--write", type=Path, help="update the python-hedge section of this markdown file")
    args = parser.parse_args()
    figures = asyncio.run(bench(args.calls))
    text = table(figures, args.calls)
    print(text)
    if args.write is not None:
        doc = args.write.read_text()
        pattern = re.compile(r"(<!-- python-hedge:begin -->\n).*?(\n<!-- python-hedge:end -->)", re.S)
        if not pattern.search(doc):
            print(f"no python-hedge markers in {args.write}: not written", file=sys.stderr)
            return
        args.write.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc, count=1))
        print(f"wrote {args.write} between <!-- python-hedge:begin --> and <!-- python-hedge:end -->")


if __name__ == "__main__":
    main()
