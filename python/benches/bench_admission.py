"""Admission limits through a Redis store: round trips per admission and per
release, and the wall time of each, next to a plain ``INCR`` (a counter, the
least a shared rate limit costs in one round trip) on the same server.

One-attempt runs of the reference policy with an admission-only fleet
section (a cap of 1,000 in flight and buckets that never queue, so every
admission is the steady state: admitted at once). The fleet admits from its
cached snapshot with one multi-key check-and-set and releases the slot with
one more; round trips are counted by the client (a pipeline is one).

    python python/benches/bench_admission.py [--runs N] [--rounds R] [--write docs/BENCHMARKS.md]

Needs ``REDIS_URL`` (run under ``tests/servers/with-redis.sh``). ``--write``
replaces the text between ``<!-- python-admission:begin -->`` and
``<!-- python-admission:end -->`` when the file has those markers.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import re
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import redis

import retryledger
from retryledger.fleet import Fleet
from retryledger.stores import RedisStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fleet import KEY, CountingRedis  # noqa: E402

ADMISSION = {
    "max_in_flight": 1_000,
    "max_queue_ms": 10_000,
    "request_burst": 1_000_000,
    "requests_per_second": 1_000_000,
}


def policy() -> retryledger.Policy:
    document: Dict[str, Any] = copy.deepcopy(retryledger.lab().report["baseline"]["policy"])
    document["fleet"] = {"admission": ADMISSION, "on_store_unavailable": "fail_closed"}
    return retryledger.Policy(document)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000, help="runs per round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; figures are medians")
    parser.add_argument("--write", type=Path, help="update the python-admission section of this markdown file")
    args = parser.parse_args(argv)
    url = os.environ.get("REDIS_URL")
    if not url:
        print("REDIS_URL is not set: run under tests/servers/with-redis.sh", file=sys.stderr)
        return 2
    client = CountingRedis.from_url(url)
    assert isinstance(client, CountingRedis)
    fleet = Fleet(RedisStore(client), namespace=f"bench-{uuid.uuid4().hex}")
    p = policy()
    release = str(p.document["routes"][0]["route_release_sha256"])
    plain = redis.Redis.from_url(url)
    counter = f"bench-{uuid.uuid4().hex}/incr"
    n: int = args.runs
    spent: Dict[str, float] = {"admit": 0.0, "release": 0.0}
    trips: Dict[str, int] = {"admit": 0, "release": 0}
    counts = {"admit": 0, "release": 0}

    def timed_call(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            before, t0 = client.trips, time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter_ns() - t0
                trips[name] += client.trips - before
                counts[name] += 1

        return call

    admit, release_fn = fleet.admit, fleet.release
    setattr(fleet, "admit", timed_call("admit", admit))
    setattr(fleet, "release", timed_call("release", release_fn))

    def ok(step: retryledger.Step) -> str:
        return "done"

    def runs() -> None:
        for _ in range(n):
            retryledger.run(p, ok, KEY, fleet=fleet)

    def incrs() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            plain.incr(counter)
        return float(time.perf_counter_ns() - t0) / n / 1000

    runs()  # warm: the cache holds the key after the first admission
    incrs()
    per: Dict[str, List[float]] = {"admit": [], "release": [], "incr": []}
    per_trips: Dict[str, List[float]] = {"admit": [], "release": []}
    for r in range(args.rounds):
        for name in ("admit", "release"):
            spent[name], trips[name], counts[name] = 0.0, 0, 0
        if r % 2:
            per["incr"].append(incrs())
            runs()
        else:
            runs()
            per["incr"].append(incrs())
        for name in ("admit", "release"):
            per[name].append(spent[name] / counts[name] / 1000)
            per_trips[name].append(trips[name] / counts[name])
    med = {k: statistics.median(v) for k, v in per.items()}
    mt = {k: statistics.median(v) for k, v in per_trips.items()}
    snapshot = fleet.admission(p, release)
    assert snapshot is not None and snapshot["in_flight"] == 0, snapshot
    plain.delete(counter)
    lines = [
        f"CPython {platform.python_version()}, redis-py {redis.__version__}, Redis on loopback; "
        f"`python/benches/bench_admission.py`, {n:,} one-attempt runs per round, median of {args.rounds} "
        "interleaved rounds; the reference policy with admission limits only (never queueing).",
        "",
        "| per attempt | round trips | wall | in plain `INCR`s |",
        "| --- | ---: | ---: | ---: |",
        f"| admission (`Fleet.admit`: one check-and-set from the cached snapshot) | **{mt['admit']:.2f}** | "
        f"{med['admit']:.1f} µs | {med['admit'] / med['incr']:.2f} |",
        f"| release (`Fleet.release`: the slot freed, one check-and-set) | {mt['release']:.2f} | "
        f"{med['release']:.1f} µs | {med['release'] / med['incr']:.2f} |",
        f"| one plain `INCR` | 1 | {med['incr']:.1f} µs | 1.00 |",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write is not None:
        doc = args.write.read_text()
        pattern = re.compile(r"(<!-- python-admission:begin -->\n).*?(\n<!-- python-admission:end -->)", re.S)
        if not pattern.search(doc):
            print(f"no python-admission markers in {args.write}: not written", file=sys.stderr)
            return 0
        args.write.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc, count=1))
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
