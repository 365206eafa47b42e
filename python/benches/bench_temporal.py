"""What the Temporal helper costs per attempt, next to a bare activity call on
the same dev server.

Against a Temporal dev server (``TEMPORAL_ADDRESS``, e.g. under
``tests/servers/with-temporal.sh``) and one in-process worker:

* the helper: a workflow that runs ``retryledger.temporal.run_attempts`` (the
  core's Session in the workflow, one activity execution per attempt, the
  facts recorded, the run sealed), its activity made with
  ``attempt_activity`` and answering at once. One attempt per run, and three
  (two ``unavailable`` answers, a backoff of 1 ms on a workflow timer between
  attempts, then success);
* bare: a workflow that calls the same kind of activity once, or three times
  in a row, with ``maximum_attempts=1`` and nothing else.

Each figure is the wall time of a whole workflow execution (start to result,
as the client sees it) divided by its attempts, the median of R interleaved
rounds of N runs per contender.

    python python/benches/bench_temporal.py [--runs N] [--rounds R] [--write docs/BENCHMARKS.md]

``--write`` replaces the text between ``<!-- python-temporal:begin -->`` and
``<!-- python-temporal:end -->`` when the file has those markers.
"""

from __future__ import annotations

import argparse
import asyncio
from importlib import metadata
import os
import platform
import re
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

# The workflow sandbox imports this module again for each run: the path is
# set once, outside it.
if not workflow.unsafe.in_sandbox():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))

with workflow.unsafe.imports_passed_through():
    import retryledger
    from retryledger import temporal as rt

    from conftest import KEY, make_policy


def policy_json() -> str:
    policy = make_policy(deadline_ms=60_000, backoff={"base_ms": 1, "max_ms": 1, "retry_after_cap_ms": 1000})
    policy["routes"] = [dict(policy["routes"][0], max_attempts=3), policy["routes"][1]]
    policy["max_total_attempts"] = 5
    return retryledger.Policy(policy).json


@activity.defn(name="bench_attempt")
@rt.attempt_activity
async def bench_attempt(step: Any, fail_first: int) -> str:
    if step.ordinal <= fail_first:
        raise retryledger.AttemptError.retryable("unavailable")
    return "ok"


@activity.defn(name="bare_attempt")
async def bare_attempt(n: int) -> str:
    return "ok"


@workflow.defn(name="BenchHelper")
class BenchHelper:
    @workflow.run
    async def run(self, policy: str, key: str, fail_first: int) -> str:
        out = await rt.run_attempts(policy, "bench_attempt", key, args=[fail_first], start_to_close_timeout=timedelta(seconds=10))
        return out.receipt_sha256


@workflow.defn(name="BenchBare")
class BenchBare:
    @workflow.run
    async def run(self, calls: int, sleep_ms: int) -> str:
        value = ""
        for n in range(calls):
            if n > 0 and sleep_ms > 0:
                await workflow.sleep(timedelta(milliseconds=sleep_ms))
            value = await workflow.execute_activity(
                bare_attempt, n, start_to_close_timeout=timedelta(seconds=10), retry_policy=RetryPolicy(maximum_attempts=1)
            )
        return value


async def measure(client: Client, task_queue: str, runs: int, rounds: int) -> Dict[str, float]:
    policy = policy_json()
    contenders: List[Tuple[str, int, Any]] = [
        ("helper, 1 attempt", 1, lambda: client.execute_workflow(BenchHelper.run, args=[policy, KEY, 0], id=f"b-{uuid.uuid4().hex}", task_queue=task_queue)),
        ("bare, 1 activity call", 1, lambda: client.execute_workflow(BenchBare.run, args=[1, 0], id=f"b-{uuid.uuid4().hex}", task_queue=task_queue)),
        ("helper, 3 attempts", 3, lambda: client.execute_workflow(BenchHelper.run, args=[policy, KEY, 2], id=f"b-{uuid.uuid4().hex}", task_queue=task_queue)),
        ("bare, 3 activity calls", 3, lambda: client.execute_workflow(BenchBare.run, args=[3, 0], id=f"b-{uuid.uuid4().hex}", task_queue=task_queue)),
        ("bare, 3 activity calls, 1 ms timers", 3, lambda: client.execute_workflow(BenchBare.run, args=[3, 1], id=f"b-{uuid.uuid4().hex}", task_queue=task_queue)),
    ]
    samples: Dict[str, List[float]] = {name: [] for name, _, _ in contenders}
    for name, _, start in contenders:  # warm-up
        await start()
    for r in range(rounds):
        order = contenders[r % len(contenders):] + contenders[: r % len(contenders)]
        for name, attempts, start in order:
            t0 = time.perf_counter()
            for _ in range(runs):
                await start()
            samples[name].append((time.perf_counter() - t0) / runs / attempts)
    return {name: statistics.median(values) for name, values in samples.items()}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms"


async def run(runs: int, rounds: int) -> Dict[str, float]:
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
    task_queue = f"bench-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[BenchHelper, BenchBare],
        activities=[bench_attempt, bare_attempt],
        workflow_runner=rt.workflow_runner("conftest"),
    ):
        return await measure(client, task_queue, runs, rounds)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10, help="workflow runs per contender per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; figures are medians")
    parser.add_argument("--write", type=Path, help="update the python-temporal section of this markdown file")
    args = parser.parse_args(argv)
    if not os.environ.get("TEMPORAL_ADDRESS"):
        print("TEMPORAL_ADDRESS is not set: run under tests/servers/with-temporal.sh", file=sys.stderr)
        return 1
    figures = asyncio.run(run(args.runs, args.rounds))
    one = figures["helper, 1 attempt"] / figures["bare, 1 activity call"]
    three = figures["helper, 3 attempts"] / figures["bare, 3 activity calls"]
    timed = figures["helper, 3 attempts"] / figures["bare, 3 activity calls, 1 ms timers"]
    text = "\n".join(
        [
            f"CPython {platform.python_version()}, temporalio {metadata.version('temporalio')}, "
            "the Temporal CLI's dev server on loopback (SQLite under `target/`), one in-process worker; "
            f"`python/benches/bench_temporal.py`, median of {args.rounds} interleaved rounds of {args.runs} workflow runs "
            "per contender, each timed from start to result as the client sees it.",
            "",
            "| per attempt (wall) | helper (`run_attempts`) | bare activity calls | ratio |",
            "| --- | --- | --- | --- |",
            f"| 1 attempt per run | {ms(figures['helper, 1 attempt'])} | {ms(figures['bare, 1 activity call'])} | {one:.2f} |",
            f"| 3 attempts per run (two `unavailable`, 1 ms backoff timers) | {ms(figures['helper, 3 attempts'])} | "
            f"{ms(figures['bare, 3 activity calls'])} | {three:.2f} |",
            f"| 3 attempts per run, the bare calls with the same two 1 ms timers | {ms(figures['helper, 3 attempts'])} | "
            f"{ms(figures['bare, 3 activity calls, 1 ms timers'])} | {timed:.2f} |",
            "",
            "Every column is dominated by the server's round trips: workflow tasks, activity tasks and, "
            "between attempts, a durable timer, which the dev server fires late by a large margin whatever "
            "its length (compare the last two rows). The helper waits on a timer for every planned delay, "
            "because an attempt never starts before its `not_before_ms`. The core's own share (validation, "
            "plans, judgements, the seal) is the microseconds of the plain driver.",
        ]
    )
    print(text)
    if args.write is not None:
        doc = args.write.read_text()
        pattern = re.compile(r"(<!-- python-temporal:begin -->\n).*?(\n<!-- python-temporal:end -->)", re.S)
        if not pattern.search(doc):
            print(f"no python-temporal markers in {args.write}: not written", file=sys.stderr)
            return 0
        args.write.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc, count=1))
        print(f"wrote {args.write} between <!-- python-temporal:begin --> and <!-- python-temporal:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
