"""The Temporal tests' workflows, attempt activity and helpers: a workflow
that runs one logical request with retryledger.temporal, its attempts as real
HTTP calls (httpx) to a counting loopback server."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

# The workflow sandbox imports this module afresh for each run; what the
# activity and the test helpers use comes from outside it.
with workflow.unsafe.imports_passed_through():
    import httpx
    import pytest

    import temporal_sink
    from retryledger import temporal as rt

TASK_QUEUE_PREFIX = "retryledger-tests"


def temporal_address() -> str:
    """The dev server's address (``TEMPORAL_ADDRESS``). Under make (``MAKELEVEL``
    set) a missing server is a failure; run by hand, the test is skipped."""
    address = os.environ.get("TEMPORAL_ADDRESS")
    if address:
        return address
    reason = "TEMPORAL_ADDRESS is not set: run under tests/servers/with-temporal.sh (it starts a Temporal dev server)"
    if os.environ.get("MAKELEVEL"):
        pytest.fail(reason)
    pytest.skip(reason)
    raise AssertionError("unreachable")


def call_loopback(step: Any, base: str) -> Dict[str, Any]:
    """One attempt: POST to the route's path with the idempotency key; an
    error status raises httpx's HTTPStatusError (status, headers, body). A
    worker started with ``RETRYLEDGER_TEST_HANG_ORDINAL=n`` hangs in attempt
    ``n`` before sending anything (a worker to kill in the middle of one)."""
    if os.environ.get("RETRYLEDGER_TEST_HANG_ORDINAL") == str(step.ordinal):
        time.sleep(600)
    with httpx.Client(timeout=10.0) as client:
        response = client.post(
            f"{base}/{step.route_id}",
            headers={"Idempotency-Key": step.idempotency_key},
            json={"ordinal": step.ordinal},
        )
        response.raise_for_status()
        value: Dict[str, Any] = response.json()
        return value


@activity.defn(name="loopback_attempt")
@rt.attempt_activity
def loopback_attempt(step: Any, base: str) -> Dict[str, Any]:
    return call_loopback(step, base)


@workflow.defn(name="ScriptedRun")
class ScriptedRun:
    """One logical request; ``attempts`` is the activity retry policy's
    maximum attempts (``None``: the helper's own, one)."""

    @workflow.run
    async def run(self, policy: str, key: str, base: str, attempts: Optional[int], timeout_s: int = 20) -> rt.RunOutput:
        retry_policy = None if attempts is None else RetryPolicy(maximum_attempts=attempts)
        out = await rt.run_attempts(
            policy,
            "loopback_attempt",
            key,
            args=[base],
            start_to_close_timeout=timedelta(seconds=timeout_s),
            retry_policy=retry_policy,
        )
        temporal_sink.SEALED.append((workflow.info().workflow_id, out.receipt_sha256))
        return out


WORKFLOWS: List[Any] = [ScriptedRun, rt.RetryledgerWorkflow]
ACTIVITIES: List[Any] = [loopback_attempt]


def runner() -> Any:
    return rt.workflow_runner("temporal_sink")
