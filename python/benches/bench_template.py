"""A policy per call: a template's bind next to build_policy, through the
extension (dict request in, Policy out), medians of interleaved rounds."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import retryledger

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 41
PER_ROUND = 2_000


def main() -> None:
    cases = json.loads((ROOT / "tests/vectors/builder.json").read_text())["cases"]
    case = next(c for c in cases if c["name"] == "build_reference_spec")
    request = json.loads(case["input"]["request"])
    spec = json.loads(case["input"]["spec"])
    key = spec.pop("idempotency_key_sha256")
    template = retryledger.compile_policy_template(spec)
    full = dict(spec, idempotency_key_sha256=key)
    assert template.bind(request, key).json == retryledger.build_policy(request, full).json
    text = json.dumps(request)
    bind, bind_text, build = [], [], []
    for _ in range(ROUNDS):
        start = time.perf_counter_ns()
        for _ in range(PER_ROUND):
            template.bind(request, key)
        bind.append((time.perf_counter_ns() - start) / PER_ROUND)
        start = time.perf_counter_ns()
        for _ in range(PER_ROUND):
            template.bind(text, key)
        bind_text.append((time.perf_counter_ns() - start) / PER_ROUND)
        start = time.perf_counter_ns()
        for _ in range(PER_ROUND // 10):
            retryledger.build_policy(request, full)
        build.append((time.perf_counter_ns() - start) / (PER_ROUND // 10))
    b, t, p = statistics.median(bind), statistics.median(bind_text), statistics.median(build)
    print(
        f"policy per call (Python): template bind {b / 1000:.2f} µs (request as dict; {t / 1000:.2f} µs as JSON text), "
        f"build_policy {p / 1000:.2f} µs, build_policy / bind = {p / b:.1f} (median of {ROUNDS} rounds)"
    )


if __name__ == "__main__":
    main()
