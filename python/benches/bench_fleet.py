"""What fleet protection costs per attempt.

* In memory (``MemoryStore``): a one-attempt ``retryledger.run`` with
  ``fleet=`` (a breaker on both routes and a retry budget: the view read, the
  admission, the compare-and-set of the budget, the breaker read, recorded
  and written back) next to the same run of the same policy without its
  fleet section. CPU is ``time.process_time_ns()``, wall
  ``time.perf_counter_ns()``; medians of R interleaved rounds.
* Against Redis (``REDIS_URL``, e.g. under ``tests/servers/with-redis.sh``):
  the store's round trips per attempt (counted) and the wall time the fleet
  adds per attempt, next to one plain ``GET``/``SET`` pair on the same
  server. Without ``REDIS_URL`` this part is skipped and says so.

    python python/benches/bench_fleet.py [--runs N] [--rounds R] [--write docs/BENCHMARKS.md]

``--write`` replaces the text between ``<!-- python-fleet:begin -->`` and
``<!-- python-fleet:end -->`` when the file has those markers, and otherwise
leaves the file alone (the figures are printed either way).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import platform
import re
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import retryledger
from retryledger.fleet import Fleet
from retryledger.stores import MemoryStore, RedisStore

KEY = "idempotency-key: tenant-7/op-summarize/INC-4471"
FLEET = {
    "breaker": {"consecutive_failures": 5, "half_open_probes": 1, "open_ms": 30_000},
    "retry_budget": {"scope": "bench/fleet", "ratio_permille": 100, "floor_per_second": 1, "max_tokens": 20},
    "on_store_unavailable": "fail_closed",
}


def policies() -> Tuple[retryledger.Policy, retryledger.Policy]:
    """The lab's reference policy (two routes) without and with a fleet section."""
    base: Dict[str, Any] = copy.deepcopy(retryledger.lab().report["baseline"]["policy"])
    with_fleet = dict(base, fleet=FLEET)
    return retryledger.Policy(base), retryledger.Policy(with_fleet)


def ok(step: retryledger.Step) -> str:
    return "ok"


def runs(policy: retryledger.Policy, n: int, fleet: Optional[Fleet]) -> Callable[[], int]:
    def go() -> int:
        done = 0
        for _ in range(n):
            if fleet is None:
                r = retryledger.run(policy, ok, KEY)
            else:
                r = retryledger.run(policy, ok, KEY, fleet=fleet)
            done += r.receipt["attempt_count"]
        return done

    return go


def timed(fn: Callable[[], int]) -> Tuple[float, float]:
    gc.collect()
    cpu0 = time.process_time_ns()
    wall0 = time.perf_counter_ns()
    fn()
    return time.process_time_ns() - cpu0, time.perf_counter_ns() - wall0


class Counting:
    """A Redis store that counts the round trips it makes (each call is one)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.trips = 0

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        self.trips += 1
        return self.store.get(key)

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        self.trips += 1
        return self.store.compare_and_set(key, expected_generation, document)

    def get_many_raw(self, keys: List[str]) -> List[Tuple[Optional[str], int]]:
        self.trips += 1
        return self.store.get_many_raw(keys)

    def compare_and_set_raw(self, key: str, expected_generation: int, text: str) -> Tuple[bool, int]:
        self.trips += 1
        return self.store.compare_and_set_raw(key, expected_generation, text)


def memory_part(n: int, rounds: int) -> Tuple[List[str], float]:
    bare, fleeted = policies()
    fleet = Fleet(MemoryStore(), namespace="bench")
    pairs = (("bare", runs(bare, n, None)), ("fleet", runs(fleeted, n, fleet)))
    for _, fn in pairs:
        fn()  # warm up
    samples: Dict[str, List[Tuple[float, float]]] = {"bare": [], "fleet": []}
    for r in range(rounds):
        for name, fn in pairs if r % 2 == 0 else tuple(reversed(pairs)):
            cpu, wall = timed(fn)
            samples[name].append((cpu / n / 1000, wall / n / 1000))
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in samples.items()}
    overhead = med["fleet"][0] - med["bare"][0]
    lines = [
        "| one-attempt run | CPU / attempt | wall / attempt |",
        "| --- | ---: | ---: |",
        f"| `run` without a fleet section | {med['bare'][0]:.1f} µs | {med['bare'][1]:.1f} µs |",
        f"| `run` with `fleet=` (`MemoryStore`: admission + breaker record) | {med['fleet'][0]:.1f} µs | {med['fleet'][1]:.1f} µs |",
        f"| fleet overhead | **{overhead:.1f} µs** | {med['fleet'][1] - med['bare'][1]:.1f} µs |",
    ]
    return lines, overhead


def redis_part(url: str, n: int, rounds: int) -> List[str]:
    import redis

    bare, fleeted = policies()
    counting = Counting(RedisStore(url=url))
    fleet = Fleet(counting, namespace=f"bench-{uuid.uuid4().hex}")
    client = redis.Redis.from_url(url)
    probe = f"bench-{uuid.uuid4().hex}/plain"

    def plain() -> int:
        for i in range(n):
            client.set(probe, b"x" * 200)
            client.get(probe)
        return n

    pairs = (("bare", runs(bare, n, None)), ("fleet", runs(fleeted, n, fleet)), ("plain", plain))
    for _, fn in pairs:
        fn()
    counting.trips = 0
    runs(fleeted, n, fleet)()
    trips = counting.trips / n
    walls: Dict[str, List[float]] = {k: [] for k, _ in pairs}
    for r in range(rounds):
        for name, fn in pairs if r % 2 == 0 else tuple(reversed(pairs)):
            walls[name].append(timed(fn)[1] / n / 1000)
    med = {k: statistics.median(v) for k, v in walls.items()}
    client.delete(probe)
    return [
        f"Redis on loopback (`RedisStore`, redis-py {redis.__version__}): **{trips:.0f} round trips per attempt** "
        "(the view of both routes' breakers and the budget in one pipeline, the budget's compare-and-set "
        "script, the attempt's breaker read and its compare-and-set script).",
        "",
        "| per attempt | wall |",
        "| --- | ---: |",
        f"| fleet overhead (`run` with `fleet=` minus without) | {med['fleet'] - med['bare']:.1f} µs |",
        f"| one plain `SET` + `GET` pair | {med['plain']:.1f} µs |",
        f"| overhead in plain pairs | {(med['fleet'] - med['bare']) / med['plain']:.2f} |",
    ]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2_000, help="runs per round")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds; figures are medians")
    parser.add_argument("--write", type=Path, help="update the python-fleet section of this markdown file")
    args = parser.parse_args(argv)
    mem, overhead = memory_part(args.runs, args.rounds)
    lines = [
        f"CPython {platform.python_version()}; `python/benches/bench_fleet.py`, {args.runs:,} one-attempt runs "
        f"per round, median of {args.rounds} interleaved rounds; the reference policy (two routes) with a "
        "breaker and a retry budget.",
        "",
        *mem,
        "",
    ]
    url = os.environ.get("REDIS_URL")
    if url:
        lines += redis_part(url, max(args.runs // 4, 100), args.rounds)
    else:
        lines.append("Redis: not measured (no `REDIS_URL`; run under `tests/servers/with-redis.sh`).")
    text = "\n".join(lines)
    print(text)
    if args.write is not None:
        doc = args.write.read_text()
        pattern = re.compile(r"(<!-- python-fleet:begin -->\n).*?(\n<!-- python-fleet:end -->)", re.S)
        if not pattern.search(doc):
            print(f"no python-fleet markers in {args.write}: not written", file=sys.stderr)
            return 0
        args.write.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc, count=1))
        print(f"wrote {args.write} between <!-- python-fleet:begin --> and <!-- python-fleet:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
