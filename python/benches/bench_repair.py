"""The cost of a run with one repair (docs/REPAIR.md) next to the same two
calls made by hand: the first answer fails its pydantic model, the repair
builds the next request from the defects, the second answer passes.

* by hand: call, validate, build the second request, call, validate;
* retryledger: ``run(..., checks=[pydantic_model(...)], repair=...)``: the
  same validations and calls, plus the core's judgement of each verdict, two
  sealed runs, the repair's policy derived by the core and the chain.

Two settings: an in-memory dispatch (the overhead alone), and the real
``openai`` client against a provider on 127.0.0.1 (what a caller sees). CPU
is ``time.process_time_ns()``, wall ``time.perf_counter_ns()``; each figure
is the median of R interleaved rounds of N logical requests.

    python python/benches/bench_repair.py [--requests N] [--rounds R] [--write docs/BENCHMARKS.md]

``--write`` replaces the text between ``<!-- python-repair:begin -->`` and
``<!-- python-repair:end -->`` (the figures are printed either way).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import openai
from pydantic import BaseModel, ValidationError

import retryledger
import retryledger.openai as rl_openai
from retryledger import checks

KEY = "bench-key: tenant-1/op-repair"
VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "plan.json"
BAD = '{"title": "disk full"}'
GOOD = '{"title": "disk full", "severity": 2}'


class Summary(BaseModel):
    title: str
    severity: int


def bench_policy() -> Dict[str, Any]:
    cases = json.loads(VECTORS.read_text())["cases"]
    case = next(c for c in cases if c["name"] == "empty_run_dispatches_primary")
    p: Dict[str, Any] = json.loads(case["input"]["policy"])
    p["idempotency_key_sha256"] = hashlib.sha256(KEY.encode()).hexdigest()
    p["deadline_ms"] = 600_000
    p["repair"] = {"max_repairs": 1, "cost_share_percent": 50}
    return p


def request(defects: List[Dict[str, Any]]) -> Dict[str, Any]:
    said = "; ".join(f"{d.get('path', '')} {d['message']}" for d in defects)
    return {
        "schema": "retryledger.request.v1",
        "operation": "chat",
        "input": [
            {"role": "user", "content": "summarize INC-4471 as JSON"},
            {"role": "user", "content": f"Your last answer was invalid ({said}). Answer again."},
        ],
    }


def by_hand(call: Callable[[Any], str]) -> str:
    """The same two calls and validations, written out."""
    first = call(None)
    try:
        Summary.model_validate_json(first)
        return first
    except ValidationError as e:
        defects = [{"message": err["msg"], "path": "/" + "/".join(str(p) for p in err["loc"])} for err in e.errors()]
    second = call(request(defects))
    Summary.model_validate_json(second)
    return second


# ---- in memory ----------------------------------------------------------------


def memory_pair(policy: Dict[str, Any]) -> Tuple[Callable[[], Any], Callable[[], Any]]:
    compiled = retryledger.Policy(policy)
    check = [checks.pydantic_model(Summary)]

    def hand() -> Any:
        return by_hand(lambda req: BAD if req is None else GOOD)

    def driven() -> Any:
        result = retryledger.run(
            compiled, lambda step: BAD if step.repair_ordinal == 0 else GOOD, KEY,
            checks=check, repair=lambda out, defects: request(defects),
        )
        assert result.chain is not None and len(result.chain["links"]) == 2
        return result

    return hand, driven


# ---- the openai client on 127.0.0.1 ------------------------------------------


def completion(content: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }).encode()


def serve() -> ThreadingHTTPServer:
    bad, good = completion(BAD), completion(GOOD)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        wbufsize = 1 << 16  # headers and body in one write (no delayed-ACK stall)

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            payload = good if len(body["messages"]) > 1 else bad
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def http_pair(policy: Dict[str, Any], base: str) -> Tuple[Callable[[], Any], Callable[[], Any]]:
    client = openai.OpenAI(base_url=base, api_key="bench", max_retries=0)
    compiled = retryledger.Policy(policy)
    clients = {r["route_id"]: client for r in policy["routes"]}
    first = [{"role": "user", "content": "summarize INC-4471 as JSON"}]
    answer_checks = rl_openai.answer_checks(json=True, validators=[checks.pydantic_model(Summary)])

    def ask(messages: Any) -> str:
        r = client.chat.completions.create(model="fake-model", messages=messages)
        return r.choices[0].message.content or ""

    def hand() -> Any:
        return by_hand(lambda req: ask(first if req is None else req["input"]))

    def driven() -> Any:
        def call(c: Any, step: retryledger.Step) -> Any:
            messages = first if step.request is None else step.request["input"]
            return c.chat.completions.create(model="fake-model", messages=messages)

        return rl_openai.run(compiled, clients, call, KEY, checks=answer_checks, repair=lambda out, defects: request(defects))

    return hand, driven


def timed(fn: Callable[[], Any], n: int) -> Tuple[float, float]:
    c0, w0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.process_time_ns() - c0) / n / 1000.0, (time.perf_counter_ns() - w0) / n / 1000.0


def measure(pair: Tuple[Callable[[], Any], Callable[[], Any]], n: int, rounds: int) -> Dict[str, float]:
    hand, driven = pair
    for _ in range(max(1, n // 10)):
        hand()
        driven()
    rows: Dict[str, List[float]] = {"hand_cpu": [], "hand_wall": [], "run_cpu": [], "run_wall": []}
    for _ in range(rounds):
        c, w = timed(hand, n)
        rows["hand_cpu"].append(c)
        rows["hand_wall"].append(w)
        c, w = timed(driven, n)
        rows["run_cpu"].append(c)
        rows["run_wall"].append(w)
    return {k: statistics.median(v) for k, v in rows.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    policy = bench_policy()
    server = serve()
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        memory = measure(memory_pair(policy), args.requests, args.rounds)
        loop = measure(http_pair(policy, base), max(1, args.requests // 8), args.rounds)
    finally:
        server.shutdown()
        server.server_close()
    lines = [
        f"CPython {platform.python_version()}; `python/benches/bench_repair.py`, one logical request whose first answer "
        f"fails its pydantic model and whose one repair passes, median of {args.rounds} interleaved rounds "
        f"({args.requests:,} requests in memory, {max(1, args.requests // 8):,} over HTTP).",
        "",
        "| setting | by hand CPU | `run` + repair CPU | ratio | by hand wall | `run` + repair wall | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in (("in-memory dispatch", memory), ("`openai` client, provider on 127.0.0.1", loop)):
        lines.append(
            f"| {name} | {m['hand_cpu']:.1f} µs | {m['run_cpu']:.1f} µs | {m['run_cpu'] / m['hand_cpu']:.2f}x "
            f"| {m['hand_wall']:.1f} µs | {m['run_wall']:.1f} µs | {m['run_wall'] / m['hand_wall']:.2f}x |"
        )
    lines += [
        "",
        f"What the repaired run adds per logical request: {memory['run_cpu'] - memory['hand_cpu']:.1f} µs CPU in memory "
        "(the verdicts judged by the core, two sealed runs, the repair's request digest, key digest and policy derived "
        "by the core, the chain); by hand there is no receipt, no budget and no bound on repairs.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write is not None:
        doc = args.write.read_text()
        pattern = re.compile(r"(<!-- python-repair:begin -->\n).*?(\n<!-- python-repair:end -->)", re.S)
        if not pattern.search(doc):
            print(f"no python-repair markers in {args.write}: not written", file=sys.stderr)
            return 0
        args.write.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc, count=1))
        print(f"wrote {args.write} between <!-- python-repair:begin --> and <!-- python-repair:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
