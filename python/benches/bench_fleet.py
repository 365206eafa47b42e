"""What fleet protection costs per attempt.

* In memory (``MemoryStore``): a one-attempt ``retryledger.run`` with
  ``fleet=`` (a breaker on both routes and a retry budget: the view read, the
  admission, the compare-and-set of the budget, the breaker read, recorded
  and written back) next to the same run of the same policy without its
  fleet section. CPU is ``time.process_time_ns()``, wall
  ``time.perf_counter_ns()``; medians of R interleaved rounds.
* Against Redis (``REDIS_URL``, e.g. under ``tests/servers/with-redis.sh``):
  the round trips per attempt to admit and to record (counted by the Redis
  client: each command, each pipeline as one) and the wall time the fleet
  adds per attempt, for the optimistic admission (the view from the fleet's
  cache, checked and written by one multi-key check-and-set: one round trip
  to admit, one to record) and for a store seen through get and
  compare-and-set alone (read before every write), next to one plain
  ``SET``/``GET`` pair on the same server. Without ``REDIS_URL`` this part
  is skipped and says so.

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

import redis

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


class CountingRedis(redis.Redis):
    """A Redis client that counts its round trips: each command sent, and each
    pipeline (sent at once) as one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trips = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.trips += 1
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute
        client = self

        def counted(raise_on_error: bool = True) -> Any:
            client.trips += 1
            return execute(raise_on_error)

        setattr(pipe, "execute", counted)
        return pipe


class PerKey:
    """A Redis store seen through get and compare-and-set alone (the path
    before the multi-key check-and-set: a read before every write, and one
    compare-and-set per snapshot)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        return self.store.get(key)

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        return self.store.compare_and_set(key, expected_generation, document)

    def get_many_raw(self, keys: List[str]) -> List[Tuple[Optional[str], int]]:
        return self.store.get_many_raw(keys)

    def compare_and_set_raw(self, key: str, expected_generation: int, text: str) -> Tuple[bool, int]:
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


def trips_per_attempt(policy: retryledger.Policy, fleet: Fleet, client: CountingRedis, n: int) -> Tuple[float, float]:
    """Round trips per attempt, to admit and to record, over ``n`` one-attempt runs."""
    admit, record = Fleet.admit, Fleet.record
    counts = [0, 0]

    def admitting(self: Fleet, *args: Any) -> Any:
        before = client.trips
        try:
            return admit(self, *args)
        finally:
            counts[0] += client.trips - before

    def recording(self: Fleet, *args: Any) -> Any:
        before = client.trips
        try:
            return record(self, *args)
        finally:
            counts[1] += client.trips - before

    setattr(fleet, "admit", admitting.__get__(fleet))
    setattr(fleet, "record", recording.__get__(fleet))
    try:
        attempts = runs(policy, n, fleet)()
    finally:
        delattr(fleet, "admit")
        delattr(fleet, "record")
    return counts[0] / attempts, counts[1] / attempts


def redis_part(url: str, n: int, rounds: int) -> List[str]:
    bare, fleeted = policies()
    client = CountingRedis.from_url(url)
    assert isinstance(client, CountingRedis)
    store = RedisStore(client)
    fleet = Fleet(store, namespace=f"bench-{uuid.uuid4().hex}")
    former = Fleet(PerKey(store), namespace=f"bench-{uuid.uuid4().hex}")
    plain_client = redis.Redis.from_url(url)
    probe = f"bench-{uuid.uuid4().hex}/plain"

    def plain() -> int:
        for i in range(n):
            plain_client.set(probe, b"x" * 200)
            plain_client.get(probe)
        return n

    pairs = (
        ("bare", runs(bare, n, None)),
        ("fleet", runs(fleeted, n, fleet)),
        ("former", runs(fleeted, n, former)),
        ("plain", plain),
    )
    for _, fn in pairs:
        fn()
    admit, record = trips_per_attempt(fleeted, fleet, client, n)
    admit0, record0 = trips_per_attempt(fleeted, former, client, n)
    walls: Dict[str, List[float]] = {k: [] for k, _ in pairs}
    for r in range(rounds):
        for name, fn in pairs if r % 2 == 0 else tuple(reversed(pairs)):
            walls[name].append(timed(fn)[1] / n / 1000)
    med = {k: statistics.median(v) for k, v in walls.items()}
    plain_client.delete(probe)
    over, over0 = med["fleet"] - med["bare"], med["former"] - med["bare"]
    return [
        f"Redis on loopback (`RedisStore`, redis-py {redis.__version__}), round trips counted by the client "
        "(a pipeline is one):",
        "",
        "| per attempt | admission | record | round trips | fleet overhead (wall) | in plain `SET` + `GET` pairs |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| read, then one compare-and-set per snapshot (a store with `get` and `compare_and_set` only) "
        f"| {admit0:.2f} | {record0:.2f} | {admit0 + record0:.2f} | {over0:.1f} µs | {over0 / med['plain']:.2f} |",
        f"| optimistic: one multi-key check-and-set (`check_and_set_raw`) to admit from the cached view, "
        "one to record from the cached breaker "
        f"| {admit:.2f} | {record:.2f} | **{admit + record:.2f}** | {over:.1f} µs | {over / med['plain']:.2f} |",
        f"| one plain `SET` + `GET` pair | | | 2 | {med['plain']:.1f} µs | 1.00 |",
        "",
        "Admission: the view (both routes' breakers and the budget) from the fleet's cache, previewed by the "
        "session, then one script that checks both breakers and writes the budget's deposit; record: the "
        "attempt's breaker from the cache in one script. No read in the steady state.",
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
