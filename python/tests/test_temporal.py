"""retryledger.temporal against a real Temporal dev server
(tests/servers/with-temporal.sh): each attempt is one activity execution
making a real HTTP call to a counting loopback server; the workflow holds the
core's Session and sleeps on durable timers.

* 429 twice then success: the same receipt digest as the plain driver given
  the same answers at the same run-clock times, and the same request count;
  the workflow replayed from its history (``Replayer``) seals the same digest.
* A worker process killed with SIGKILL while the run waits out a Retry-After
  on a workflow timer: a new worker process finishes the run, the loopback
  server sees exactly as many requests as the plain run.
* An activity retry policy of more than one attempt (Temporal's default
  retries without limit) is refused with ``retry_owner_not_harness`` before
  any request.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, Worker

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import retryledger
from retryledger import temporal as rt
from retryledger.otel import RunTelemetry

from conftest import KEY, make_policy
from loopback import Reply, ScriptedServer
import temporal_sink
import temporal_support as support

HERE = Path(__file__).resolve().parent


def policy_json(primary_attempts: int = 3) -> str:
    """The reference policy with room for long Retry-After waits: three
    attempts on the primary route, a two-minute deadline, hints up to a minute."""
    policy = make_policy(
        deadline_ms=120_000,
        backoff={"base_ms": 100, "max_ms": 1000, "retry_after_cap_ms": 60_000},
    )
    policy["routes"] = copy.deepcopy(policy["routes"])
    policy["routes"][0]["max_attempts"] = primary_attempts
    policy["max_total_attempts"] = primary_attempts + 2
    return retryledger.Policy(policy).json


def stream_policy_json() -> str:
    """A policy of the stream vectors with a stream contract, for this suite's key."""
    cases = json.loads((HERE.parents[1] / "tests" / "vectors" / "stream.json").read_text())["cases"]
    policy: Dict[str, Any] = json.loads(next(c["input"]["policy"] for c in cases if c["op"] == "stream_session"))
    assert "stream" in policy
    policy["idempotency_key_sha256"] = make_policy()["idempotency_key_sha256"]
    return retryledger.Policy(policy).json


def fleet_policy_json() -> str:
    """The reference policy with a fleet section (a breaker)."""
    breaker = {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 1_000}
    return retryledger.Policy(make_policy(fleet={"breaker": breaker, "on_store_unavailable": "fail_closed"})).json


def job_policy_json() -> str:
    """The reference policy with an async_job section."""
    return retryledger.Policy(make_policy(async_job={"max_polls": 3, "poll_base_ms": 100, "poll_max_ms": 1_000})).json


def server(script: List[Reply]) -> ScriptedServer:
    return ScriptedServer({"private-primary": script, "external-fallback": [(200, {})]}, lambda status: {"status": status}).start()


class Timeline:
    """The plain driver's clock and sleep, replaying the run-clock times at
    which the workflow's attempts started and completed: sleeping moves to
    the next attempt's start (never short of what was asked), an attempt
    moves the clock to its completion."""

    def __init__(self, attempts: List[Dict[str, Any]]) -> None:
        self.spans = [(a["started_at_ms"], a["completed_at_ms"]) for a in attempts]
        self.now = 0
        self.index = 0
        self.sleeps: List[float] = []

    def __call__(self) -> float:
        return float(self.now)

    def sleep(self, ms: float) -> None:
        self.sleeps.append(ms)
        self.now = max(self.now + int(ms), self.spans[self.index][0])

    def dispatch(self, step: retryledger.Step, base: str) -> Dict[str, Any]:
        started, completed = self.spans[self.index]
        assert step.started_at_ms == started
        self.index += 1
        try:
            return support.call_loopback(step, base)
        finally:
            self.now = completed


def plain_run(policy: str, script: List[Reply], attempts: List[Dict[str, Any]]) -> Tuple[str, int]:
    """The plain sync driver on the same script and run-clock times: its
    receipt digest and how many requests its loopback server saw."""
    srv = server(script)
    try:
        timeline = Timeline(attempts)
        result = retryledger.run(
            policy, lambda step: timeline.dispatch(step, srv.base()), KEY, clock=timeline, sleep=timeline.sleep
        )
        return result.receipt_sha256, srv.count()
    finally:
        srv.stop()


async def replayed_digest(client: Client, workflow_id: str) -> str:
    """Replay the workflow from its history in this process: the digest it seals."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    before = len(temporal_sink.SEALED)
    replayer = Replayer(workflows=support.WORKFLOWS, workflow_runner=support.runner())
    result = await replayer.replay_workflow(history)
    assert result.replay_failure is None
    replays = [d for w, d in temporal_sink.SEALED[before:] if w == workflow_id]
    assert len(replays) == 1
    digest: str = replays[0]
    return digest


def queue() -> str:
    return f"{support.TASK_QUEUE_PREFIX}-{uuid.uuid4().hex[:12]}"


SCRIPT_429_TWICE: List[Reply] = [(429, {"retry-after": "1"}), (429, {"retry-after": "1"}), (200, {})]


def test_429_twice_then_success_is_the_plain_drivers_run() -> None:
    address = support.temporal_address()

    async def main() -> None:
        client = await Client.connect(address)
        task_queue = queue()
        policy = policy_json()
        srv = server(SCRIPT_429_TWICE)
        try:
            async with Worker(
                client,
                task_queue=task_queue,
                workflows=support.WORKFLOWS,
                activities=support.ACTIVITIES,
                workflow_runner=support.runner(),
            ):
                workflow_id = f"w-{uuid.uuid4().hex}"
                out = await client.execute_workflow(
                    support.ScriptedRun.run,
                    args=[policy, KEY, srv.base(), None],
                    id=workflow_id,
                    task_queue=task_queue,
                )
            count = srv.count()
            keys = {r.idempotency_key for r in srv.requests}
        finally:
            srv.stop()
        assert out.terminal == "completed"
        assert out.value == {"status": 200}
        assert count == 3 and keys == {KEY}
        assert retryledger.verify_bundle(out.bundle_json)["kind"] == "verified"
        attempts = out.bundle["attempts"]["attempts"]
        assert [a["outcome"]["class"] for a in attempts] == ["retryable", "retryable", "success"]
        # Each retry waited out its one-second Retry-After on a workflow timer.
        for before, after in zip(attempts, attempts[1:]):
            assert after["started_at_ms"] - before["completed_at_ms"] >= 1000
        assert retryledger.digest(out.bundle["receipt"]) == out.receipt_sha256

        plain_digest, plain_count = plain_run(policy, SCRIPT_429_TWICE, attempts)
        assert plain_digest == out.receipt_sha256
        assert plain_count == count

        assert await replayed_digest(client, workflow_id) == out.receipt_sha256
        print(f"temporal (python): 429 twice then 200: {count} requests, receipt {out.receipt_sha256[:12]}, "
              "plain driver and replay equal")

    asyncio.run(main())


def start_worker(task_queue: str, hang_ordinal: Optional[int] = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    env.pop("RETRYLEDGER_TEST_HANG_ORDINAL", None)
    if hang_ordinal is not None:
        env["RETRYLEDGER_TEST_HANG_ORDINAL"] = str(hang_ordinal)
    worker = subprocess.Popen(
        [sys.executable, str(HERE / "temporal_worker.py"), task_queue],
        cwd=str(HERE),
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready"
    return worker


async def timer_started(client: Client, workflow_id: str) -> bool:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in history.events)


SCRIPT_LONG_WAIT: List[Reply] = [(429, {"retry-after": "4"}), (429, {"retry-after": "1"}), (200, {})]


def test_a_worker_killed_during_a_retry_after_timer_is_replaced() -> None:
    address = support.temporal_address()

    async def main() -> None:
        client = await Client.connect(address)
        task_queue = queue()
        policy = policy_json()
        srv = server(SCRIPT_LONG_WAIT)
        first: Optional[subprocess.Popen[str]] = start_worker(task_queue)
        second: Optional[subprocess.Popen[str]] = None
        try:
            workflow_id = f"w-{uuid.uuid4().hex}"
            handle = await client.start_workflow(
                support.ScriptedRun.run,
                args=[policy, KEY, srv.base(), None],
                id=workflow_id,
                task_queue=task_queue,
            )
            deadline = time.monotonic() + 60
            while not (srv.count() == 1 and await timer_started(client, workflow_id)):
                assert time.monotonic() < deadline, "the first attempt and its timer did not happen"
                await asyncio.sleep(0.05)
            assert first is not None
            first.send_signal(signal.SIGKILL)
            assert first.wait(timeout=10) == -signal.SIGKILL
            first = None
            # Parked on the server: nothing is sent while no worker runs.
            await asyncio.sleep(0.5)
            assert srv.count() == 1
            second = start_worker(task_queue)
            out = await asyncio.wait_for(handle.result(), timeout=90)
            count = srv.count()
        finally:
            srv.stop()
            for w in (first, second):
                if w is not None and w.poll() is None:
                    w.kill()
                    w.wait()
        assert out.terminal == "completed"
        assert count == 3
        attempts = out.bundle["attempts"]["attempts"]
        assert attempts[1]["started_at_ms"] - attempts[0]["completed_at_ms"] >= 4000
        plain_digest, plain_count = plain_run(policy, SCRIPT_LONG_WAIT, attempts)
        assert plain_count == count
        assert plain_digest == out.receipt_sha256
        assert await replayed_digest(client, workflow_id) == out.receipt_sha256
        print(f"temporal (python): worker SIGKILLed during a 4 s Retry-After timer, new worker finished: "
              f"{count} requests (plain run {plain_count})")

    asyncio.run(main())


def test_an_activity_retry_policy_of_more_than_one_attempt_is_refused() -> None:
    for given in (RetryPolicy(), RetryPolicy(maximum_attempts=3)):
        with pytest.raises(retryledger.PolicyError) as info:
            rt.check_retry_policy(given)
        assert info.value.code == "retry_owner_not_harness"
        assert info.value.path == "/retry_policy/maximum_attempts"
    assert rt.check_retry_policy(None).maximum_attempts == 1
    assert rt.check_retry_policy(RetryPolicy(maximum_attempts=1)).maximum_attempts == 1

    address = support.temporal_address()

    async def main() -> None:
        client = await Client.connect(address)
        task_queue = queue()
        policy = policy_json()
        srv = server([(200, {})])
        try:
            async with Worker(
                client,
                task_queue=task_queue,
                workflows=support.WORKFLOWS,
                activities=support.ACTIVITIES,
                workflow_runner=support.runner(),
            ):
                # Temporal's default retry policy (0: unlimited), then three attempts.
                for attempts in (0, 3):
                    with pytest.raises(WorkflowFailureError) as failed:
                        await client.execute_workflow(
                            support.ScriptedRun.run,
                            args=[policy, KEY, srv.base(), attempts],
                            id=f"w-{uuid.uuid4().hex}",
                            task_queue=task_queue,
                        )
                    cause = failed.value.cause
                    assert isinstance(cause, ApplicationError)
                    assert cause.type == "retry_owner_not_harness" and cause.non_retryable
                # The ready workflow refuses the same way.
                with pytest.raises(WorkflowFailureError) as failed:
                    await client.execute_workflow(
                        rt.RetryledgerWorkflow.run,
                        rt.RunInput(policy=policy, activity="loopback_attempt", idempotency_key=KEY,
                                    args=[srv.base()], activity_maximum_attempts=0),
                        id=f"w-{uuid.uuid4().hex}",
                        task_queue=task_queue,
                    )
                assert isinstance(failed.value.cause, ApplicationError)
                assert failed.value.cause.type == "retry_owner_not_harness"
                # A policy with a stream contract, before any dispatch too.
                with pytest.raises(WorkflowFailureError) as failed:
                    await client.execute_workflow(
                        rt.RetryledgerWorkflow.run,
                        rt.RunInput(policy=stream_policy_json(), activity="loopback_attempt", idempotency_key=KEY, args=[srv.base()]),
                        id=f"w-{uuid.uuid4().hex}",
                        task_queue=task_queue,
                    )
                assert isinstance(failed.value.cause, ApplicationError)
                assert failed.value.cause.type == "stream_record_missing"
                # A fleet section and an async job: the core's refusals of a
                # workflow driver (docs/COMPOSITION.md), before any dispatch.
                for refused_policy, code in ((fleet_policy_json(), "admission_missing"), (job_policy_json(), "invalid_async_job")):
                    with pytest.raises(WorkflowFailureError) as failed:
                        await client.execute_workflow(
                            rt.RetryledgerWorkflow.run,
                            rt.RunInput(policy=refused_policy, activity="loopback_attempt", idempotency_key=KEY, args=[srv.base()]),
                            id=f"w-{uuid.uuid4().hex}",
                            task_queue=task_queue,
                        )
                    cause = failed.value.cause
                    assert isinstance(cause, ApplicationError) and cause.type == code and cause.non_retryable
                refused = srv.count()
                # And runs with one attempt per activity.
                out = await client.execute_workflow(
                    rt.RetryledgerWorkflow.run,
                    rt.RunInput(policy=policy, activity="loopback_attempt", idempotency_key=KEY, args=[srv.base()]),
                    id=f"w-{uuid.uuid4().hex}",
                    task_queue=task_queue,
                )
        finally:
            srv.stop()
        assert refused == 0
        assert out.terminal == "completed" and json.loads(out.bundle_json)["receipt"]["attempt_count"] == 1
        # The one result shape: value, receipt, receipt_sha256, bundle; otel.record takes it.
        assert out.receipt == out.bundle["receipt"] and retryledger.digest(out.receipt) == out.receipt_sha256
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        spans = RunTelemetry(provider.get_tracer("test")).record(out)
        assert spans.run.attributes["retryledger.receipt_sha256"] == out.receipt_sha256
        assert [s.name for s in exporter.get_finished_spans()].count(spans.run.name) == 1

    asyncio.run(main())


def test_a_cancelled_workflow_records_the_cancellation_and_returns_its_sealed_run() -> None:
    """Cancelled while parked on a 30 s Retry-After timer: no other request, the
    run sealed with ``stop_cancelled`` and its ``cancelled_at_ms``."""
    address = support.temporal_address()

    async def main() -> None:
        client = await Client.connect(address)
        task_queue = queue()
        policy = policy_json()
        srv = server([(429, {"retry-after": "30"}), (200, {})])
        try:
            async with Worker(
                client,
                task_queue=task_queue,
                workflows=support.WORKFLOWS,
                activities=support.ACTIVITIES,
                workflow_runner=support.runner(),
            ):
                workflow_id = f"w-{uuid.uuid4().hex}"
                handle = await client.start_workflow(
                    support.ScriptedRun.run, args=[policy, KEY, srv.base(), None], id=workflow_id, task_queue=task_queue
                )
                deadline = time.monotonic() + 60
                while not (srv.count() == 1 and await timer_started(client, workflow_id)):
                    assert time.monotonic() < deadline, "the first attempt and its timer did not happen"
                    await asyncio.sleep(0.05)
                await handle.cancel()
                out = await asyncio.wait_for(handle.result(), timeout=30)
            count = srv.count()
        finally:
            srv.stop()
        assert out.terminal == "stop_cancelled"
        assert count == 1
        assert retryledger.verify_bundle(out.bundle_json)["kind"] == "verified"
        attempts = out.bundle["attempts"]
        assert len(attempts["attempts"]) == 1
        assert attempts["cancelled_at_ms"] >= attempts["attempts"][0]["completed_at_ms"]
        assert await replayed_digest(client, workflow_id) == out.receipt_sha256

    asyncio.run(main())


async def activity_started(client: Client, workflow_id: str) -> bool:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED for e in history.events)


def test_a_worker_killed_during_an_attempt_times_out_and_the_core_plans_the_retry() -> None:
    """The worker running attempt 1 is killed with SIGKILL before it sends
    anything: the activity execution never reports, its start-to-close timeout
    (3 s) fails it in the workflow, the core judges the timeout
    (``timeout_before_response``, retryable: the route takes idempotency keys)
    and a new worker runs attempt 2, with the same key."""
    address = support.temporal_address()

    async def main() -> None:
        client = await Client.connect(address)
        task_queue = queue()
        policy = policy_json()
        srv = server([(200, {})])
        first: Optional[subprocess.Popen[str]] = start_worker(task_queue, hang_ordinal=1)
        second: Optional[subprocess.Popen[str]] = None
        try:
            workflow_id = f"w-{uuid.uuid4().hex}"
            handle = await client.start_workflow(
                support.ScriptedRun.run, args=[policy, KEY, srv.base(), None, 3], id=workflow_id, task_queue=task_queue
            )
            deadline = time.monotonic() + 60
            while not await activity_started(client, workflow_id):
                assert time.monotonic() < deadline, "attempt 1 did not start"
                await asyncio.sleep(0.05)
            assert first is not None
            first.send_signal(signal.SIGKILL)
            assert first.wait(timeout=10) == -signal.SIGKILL
            first = None
            second = start_worker(task_queue)
            out = await asyncio.wait_for(handle.result(), timeout=90)
            count = srv.count()
            keys = {r.idempotency_key for r in srv.requests}
        finally:
            srv.stop()
            for w in (first, second):
                if w is not None and w.poll() is None:
                    w.kill()
                    w.wait()
        assert out.terminal == "completed"
        assert count == 1 and keys == {KEY}
        attempts = out.bundle["attempts"]["attempts"]
        assert [a["outcome"] for a in attempts] == [
            {"class": "retryable", "kind": "timeout_before_response"},
            {"class": "success"},
        ]
        assert attempts[0]["completed_at_ms"] - attempts[0]["started_at_ms"] >= 3000
        assert retryledger.verify_bundle(out.bundle_json)["kind"] == "verified"
        assert await replayed_digest(client, workflow_id) == out.receipt_sha256

    asyncio.run(main())
