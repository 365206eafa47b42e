"""run_job and run_job_async on the host loop: the run hooks see the job's
attempts (the plain driver's hook documents), a task cancelled before the
submit is sent stops the run with nothing sent, and a job run's result is
the one shape ``otel.record`` takes."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest

import retryledger
from retryledger.job import AsyncJobCalls, JobAnswer, JobCalls, run_job, run_job_async

from conftest import KEY, make_policy


def job_policy() -> Dict[str, Any]:
    return make_policy(
        async_job={"cancel_left_running": True, "max_polls": 4, "poll_base_ms": 200, "poll_max_ms": 1_000},
        deadline_ms=20_000,
    )


def calls(sent: List[str]) -> JobCalls[str]:
    """Calls that accept the job, then answer ``in_progress`` once and ``completed``."""
    statuses = ["in_progress", "completed"]

    def submit(step: retryledger.Step) -> JobAnswer[str]:
        sent.append("submit")
        return JobAnswer(status="queued", value="accepted", id="job-1")

    def poll(job_id: str, step: retryledger.Step) -> JobAnswer[str]:
        sent.append(f"poll:{job_id}")
        status = statuses.pop(0) if statuses else "completed"
        return JobAnswer(status=status, value="the answer" if status == "completed" else "running")

    def cancel(job_id: str) -> None:
        sent.append(f"cancel:{job_id}")

    return JobCalls(submit=submit, poll=poll, cancel=cancel)


def test_the_hooks_see_each_decision_wait_attempt_and_the_receipt_of_a_job() -> None:
    now = [0.0]
    seen: List[str] = []
    sent: List[str] = []

    def sleep(ms: float) -> None:
        now[0] += ms

    def on_decision(d: Dict[str, Any]) -> None:
        seen.append(f"decision:{d['ordinal']}:{d['job']['kind']}" if d["kind"] == "dispatch" else f"decision:{d['terminal']}")

    def on_sleep(s: Dict[str, Any]) -> None:
        seen.append(f"sleep:{s['ordinal']}:{s['route_id']}:{s['sleep_ms'] == s['not_before_ms'] - s['at_ms']}")

    def on_attempt(a: Dict[str, Any], j: Any) -> None:
        seen.append(f"attempt:{a['ordinal']}:{a['job'].get('status')}:{j.rule}")

    run = run_job(
        job_policy(),
        calls(sent),
        KEY,
        clock=lambda: now[0],
        sleep=sleep,
        on_decision=on_decision,
        on_sleep=on_sleep,
        on_attempt=on_attempt,
        on_terminal=lambda r: seen.append(f"terminal:{r['terminal']}"),
    )
    assert run.value.value == "the answer"
    assert sent == ["submit", "poll:job-1", "poll:job-1"]
    route = run.bundle["attempts"]["attempts"][0]["route_id"]
    assert seen == [
        "decision:1:submit",
        "attempt:1:queued:returned",
        f"sleep:2:{route}:True",
        "decision:2:poll",
        "attempt:2:in_progress:returned",
        f"sleep:3:{route}:True",
        "decision:3:poll",
        "attempt:3:completed:returned",
        "decision:completed",
        "terminal:completed",
    ]
    assert run.receipt_sha256 == retryledger.digest(run.receipt)
    assert retryledger.verify_bundle(run.bundle_json)["kind"] == "verified"


def test_a_task_cancelled_while_the_job_waits_sends_the_planned_cancel_and_raises_run_cancelled() -> None:
    sent: List[str] = []

    async def submit(step: retryledger.Step) -> JobAnswer[str]:
        sent.append("submit")
        return JobAnswer(status="queued", value="accepted", id="job-1")

    async def poll(job_id: str, step: retryledger.Step) -> JobAnswer[str]:
        sent.append(f"poll:{job_id}")
        return JobAnswer(status="in_progress", value="running")

    async def cancel(job_id: str) -> None:
        sent.append(f"cancel:{job_id}")

    async def sleep(ms: float) -> None:
        await asyncio.sleep(10)  # the wait before the first poll: cancelled meanwhile

    async def scenario() -> retryledger.RunCancelledError:
        task = asyncio.ensure_future(run_job_async(job_policy(), AsyncJobCalls(submit=submit, poll=poll, cancel=cancel), KEY, sleep=sleep))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(retryledger.RunCancelledError) as e:
            await task
        return e.value

    error = asyncio.run(scenario())
    assert sent == ["submit", "cancel:job-1"]
    assert error.code == "stop_cancelled"
    attempts = error.bundle["attempts"]["attempts"]
    assert [a["job"]["kind"] for a in attempts] == ["submit", "cancel"]
    assert retryledger.verify_bundle(error.bundle_json)["kind"] == "verified"
