"""Temporal as the one retry owner's host: the workflow holds the core's
run machine, sleeps on durable timers and runs each attempt as one activity
execution whose own retries are off (docs/TEMPORAL.md).

    from retryledger import temporal as rt

    @activity.defn(name="summarize")
    @rt.attempt_activity
    async def summarize(step: rt.ActivityStep, text: str) -> str:
        ...  # one attempt: raise what the SDK raises, return the value

    @workflow.defn
    class Summarize:
        @workflow.run
        async def run(self, policy: str, key: str, text: str) -> rt.RunOutput:
            return await rt.run_attempts(policy, "summarize", key, args=[text],
                                         start_to_close_timeout=timedelta(seconds=60))

    Worker(client, task_queue=..., workflows=[Summarize], activities=[summarize],
           workflow_runner=rt.workflow_runner())

What runs where:

* In the workflow (deterministic, replayed from history): the policy's
  validation and the run machine, driven by the host loop
  (docs/HOST_LOOP.md: sleep on a workflow timer, dispatch as one activity
  execution), the timers until each attempt's ``not_before_ms`` and the seal. The core is passed
  through the workflow sandbox (:func:`workflow_runner`): it has no I/O, no
  clock and no randomness of its own, so running it in the workflow is
  deterministic and nothing else is needed to replay it. The run clock is
  workflow time (``workflow.time_ns()``) since the run started, the wall clock
  of the facts of a failed activity is ``workflow.now()``.
* In the activity (:func:`attempt_activity`): the one attempt, and the plain
  facts of what it did (the same :func:`retryledger.facts_of` the drivers
  use). The activity always completes with those facts: Temporal never sees
  the attempt fail, so it never retries it; the core judges it.
* An activity execution that does not report (its worker died, its
  start-to-close timeout passed) fails in the workflow with Temporal's
  ``ActivityError``; its facts (error names along its cause chain, such as
  ``TimeoutError``) go to the core like any raised error.
* A cancelled workflow records its cancellation: between attempts as the
  run's ``cancelled_at_ms`` (terminal ``stop_cancelled``), during one as that
  attempt's ``cancelled`` fact (indeterminate, never retried), and returns
  its sealed run like any other.

Temporal's activity retry policy must be one attempt: the helper passes
``RetryPolicy(maximum_attempts=1)`` itself and refuses any other before the
first dispatch with :class:`retryledger.PolicyError`
``retry_owner_not_harness`` (in a workflow, an ``ApplicationError`` of that
type, not retryable, so the workflow fails with the code instead of
retrying). Temporal's default policy (``RetryPolicy()``, unlimited attempts)
is the case this refuses.

The workflow returns a :class:`RunOutput` (JSON by Temporal's data
converter): the terminal, the receipt digest, the sealed bundle as canonical
JSON and, for a completed run, the successful attempt's value.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Union

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.exceptions import CancelledError as TemporalCancelledError
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from . import _core
from ._api import Document, Policy, call, check_integer, to_text
from ._driver import Classifier, _checked, _schedule_for, facts_of
from ._errors import DriftError, PolicyError, RetryledgerError
from ._loop import Adapter, Machine, pump_async, run_loop

__all__ = [
    "ONE_ATTEMPT",
    "ActivityStep",
    "AttemptInput",
    "AttemptReport",
    "RunInput",
    "RunOutput",
    "RetryledgerWorkflow",
    "attempt_activity",
    "check_retry_policy",
    "run_attempts",
    "workflow_runner",
]

#: The only activity retry policy the helper runs attempts under.
ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)


def check_retry_policy(retry_policy: Optional[RetryPolicy]) -> RetryPolicy:
    """The activity retry policy to dispatch attempts under: ``None`` is
    :data:`ONE_ATTEMPT`; a policy of exactly one attempt is kept; any other
    (Temporal's default ``RetryPolicy()`` retries without limit) raises
    :class:`PolicyError` ``retry_owner_not_harness``: the engine would retry
    attempts the core never saw."""
    if retry_policy is None:
        return ONE_ATTEMPT
    if not isinstance(retry_policy, RetryPolicy):
        raise DriftError("invalid_type", "retry_policy takes a temporalio.common.RetryPolicy", "/retry_policy")
    if retry_policy.maximum_attempts != 1:
        what = "without limit" if retry_policy.maximum_attempts == 0 else f"up to {retry_policy.maximum_attempts} times"
        raise PolicyError(
            "retry_owner_not_harness",
            f"the activity retry policy retries {what}: retries must be owned by the harness, "
            "set maximum_attempts=1 (one activity execution per planned attempt)",
            "/retry_policy/maximum_attempts",
        )
    return retry_policy


def workflow_runner(*modules: str) -> SandboxedWorkflowRunner:
    """The workflow sandbox with ``retryledger`` (and ``modules``) passed
    through: the core's extension module is imported once, outside the
    sandbox, and used from workflow code. It is deterministic (no I/O, clock
    or randomness), which is what pass-through requires."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules("retryledger", *modules)
    return SandboxedWorkflowRunner(restrictions=restrictions)


# ---- the documents between workflow and activity ----------------------------


@dataclass
class AttemptInput:
    """What the workflow hands the activity of one attempt."""

    #: The planned dispatch, as the core's ``Dispatch.to_dict()``.
    plan: Dict[str, Any]
    #: The raw idempotency key (its digest is the policy's).
    idempotency_key: str
    #: When the attempt started on the run clock, ms.
    started_at_ms: int
    #: The caller's arguments for the attempt.
    args: List[Any] = field(default_factory=list)
    #: The run's price schedule as JSON text, when it has one.
    price_schedule: Optional[str] = None


@dataclass
class AttemptReport:
    """What the activity reports of its attempt: facts only."""

    #: The facts as the core's JSON (``retryledger.Facts``).
    facts: str
    #: The value the attempt returned (on ``result: returned``).
    value: Any = None
    #: A cost charged by hand.
    cost: Optional[int] = None
    #: Raw usage as JSON text (kind -> units), priced by the core.
    usage: Optional[str] = None
    #: SHA-256 of the request body the attempt sent.
    request_body_sha256: Optional[str] = None


@dataclass
class RunOutput:
    """The workflow's result: the sealed run."""

    #: How the run ended (``completed``, ``stop_route_exhausted``, ...).
    terminal: str
    #: SHA-256 of the receipt's canonical JSON.
    receipt_sha256: str
    #: The bundle (policy, attempts, receipt) as canonical JSON.
    bundle_json: str
    #: The successful attempt's value, for a completed run.
    value: Any = None

    @property
    def bundle(self) -> Dict[str, Any]:
        """The bundle as a plain dict."""
        value: Dict[str, Any] = json.loads(self.bundle_json)
        return value

    @property
    def receipt(self) -> Dict[str, Any]:
        """The sealed receipt as a plain dict (the one result shape: value,
        receipt, ``receipt_sha256``, bundle; ``otel.record`` takes it)."""
        value: Dict[str, Any] = self.bundle["receipt"]
        return value


@dataclass
class RunInput:
    """The input of :class:`RetryledgerWorkflow`."""

    #: The policy (JSON text or a mapping).
    policy: Union[str, Dict[str, Any]]
    #: The name of the attempt activity (made with :func:`attempt_activity`).
    activity: str
    #: The raw idempotency key.
    idempotency_key: str
    #: The activity's arguments after its step.
    args: List[Any] = field(default_factory=list)
    #: The start-to-close timeout of each attempt, ms.
    start_to_close_timeout_ms: int = 60_000
    #: The activity retry policy's maximum attempts; only 1 is accepted.
    activity_maximum_attempts: int = 1
    #: The task queue of the attempts (default: the workflow's).
    task_queue: Optional[str] = None
    #: A price schedule (JSON text), checked against the policy before the first dispatch.
    price_schedule: Optional[str] = None


# ---- the activity side ---------------------------------------------------------


class ActivityStep:
    """One planned attempt as the activity receives it; the same attributes
    and calls as the drivers' :class:`retryledger.Step`, so one dispatch
    function serves both."""

    def __init__(self, data: AttemptInput) -> None:
        #: The planned dispatch as a dict (every field of the core's decision).
        self.plan = dict(data.plan)
        #: The raw idempotency key; send it with every attempt.
        self.idempotency_key = data.idempotency_key
        #: When the attempt started on the run clock, ms.
        self.started_at_ms = data.started_at_ms
        self._schedule = data.price_schedule
        self._cost: Optional[int] = None
        self._usage: Optional[Dict[str, int]] = None
        self._body: Optional[str] = None
        self._delivered = False

    @property
    def ordinal(self) -> int:
        """Global ordinal of the attempt, from 1."""
        value: int = self.plan["ordinal"]
        return value

    @property
    def route_id(self) -> str:
        """The route to dispatch to."""
        value: str = self.plan["route_id"]
        return value

    @property
    def route_ordinal(self) -> int:
        """Ordinal on the route, from 1."""
        value: int = self.plan["route_ordinal"]
        return value

    @property
    def route_release_sha256(self) -> str:
        """The exact route release the policy names."""
        value: str = self.plan["route_release_sha256"]
        return value

    @property
    def deadline_ms(self) -> int:
        """The run's deadline on the run clock, ms."""
        value: int = self.plan["deadline_ms"]
        return value

    @property
    def reserve_cost(self) -> int:
        """Worst-case cost reserved for this attempt."""
        value: int = self.plan["reserve_cost"]
        return value

    @property
    def remaining_ms(self) -> int:
        """Milliseconds left until the run's deadline when the attempt started."""
        return max(0, self.deadline_ms - self.started_at_ms)

    def charge(self, cost: int) -> None:
        """Record actual cost of this attempt (adds up when called more than once)."""
        if self._usage is not None:
            raise PolicyError("charge_with_usage", "an attempt's cost is either charged by hand or priced from its usage, not both", "/cost")
        cost = check_integer("cost", cost)
        self._cost = check_integer("cost", cost + (self._cost or 0))

    def usage(self, units: Mapping[str, int]) -> None:
        """Record raw usage (kind -> units; reports add up); the workflow has the core price it."""
        if self._schedule is None:
            raise PolicyError(
                "price_schedule_missing_release",
                "the run has no price schedule: give price_schedule= to charge usage",
                "/price_schedule",
            )
        if self._cost is not None:
            raise PolicyError("charge_with_usage", "an attempt's cost is either charged by hand or priced from its usage, not both", "/cost")
        merged = dict(self._usage or {})
        for kind, count in units.items():
            merged[kind] = merged.get(kind, 0) + check_integer("usage", count)
        self._usage = merged

    def request_body(self, body: Union[bytes, bytearray, memoryview, str]) -> None:
        """Record the request body this attempt sent (its SHA-256 is recorded)."""
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        self._body = hashlib.sha256(data).hexdigest()

    @property
    def price_schedule(self) -> Optional[str]:
        """The run's price schedule as JSON text, or ``None``."""
        return self._schedule

    def output_delivered(self) -> None:
        """Response bytes reached the caller: a failure after this is never retried."""
        self._delivered = True

    @property
    def cost(self) -> int:
        """The cost recorded for this attempt: what was charged, else ``reserve_cost``."""
        return self.reserve_cost if self._cost is None else self._cost

    def report(self, facts: _core.Facts, value: Any = None) -> AttemptReport:
        """The activity's report of this attempt."""
        usage = None if self._usage is None else to_text(self._usage)
        return AttemptReport(facts=facts.json, value=value, cost=self._cost, usage=usage, request_body_sha256=self._body)

    def __repr__(self) -> str:
        return f"ActivityStep(ordinal={self.ordinal}, route_id={self.route_id!r}, remaining_ms={self.remaining_ms})"


_RETURNED = _core.Facts(result="returned")


def attempt_activity(
    fn: Optional[Callable[..., Any]] = None, *, classify: Optional[Classifier] = None
) -> Any:
    """Wrap a dispatch function (``fn(step, *args)``, sync or async, the same
    function the plain drivers call) as the body of an attempt activity:
    it takes an :class:`AttemptInput`, runs ``fn`` once and returns an
    :class:`AttemptReport` with the facts of what happened, never raising
    for the attempt's own failure. Decorate the result with
    ``@activity.defn`` (an async function; a sync ``fn`` runs in a thread).
    ``classify`` is the drivers' hook."""

    def wrap(inner: Callable[..., Any]) -> Callable[[AttemptInput], Awaitable[AttemptReport]]:
        is_async = inspect.iscoroutinefunction(inner)

        @functools.wraps(inner)
        async def body(data: AttemptInput) -> AttemptReport:
            step = ActivityStep(data)
            try:
                if is_async:
                    value = await inner(step, *data.args)
                else:
                    value = await asyncio.get_running_loop().run_in_executor(None, lambda: inner(step, *data.args))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                facts = facts_of(
                    exc, classify=classify, output_delivered=step._delivered, now_unix_ms=int(time.time() * 1000)
                )
                return step.report(facts)
            return step.report(_RETURNED, value)

        # The wrapped function's signature is not the activity's.
        body.__dict__.pop("__wrapped__", None)
        body.__annotations__ = {"data": AttemptInput, "return": AttemptReport}
        return body

    if fn is not None:
        return wrap(fn)
    return wrap


# ---- the workflow side -----------------------------------------------------------


def _coded(error: RetryledgerError) -> ApplicationError:
    """A core error as a workflow failure: not retryable, its type the code."""
    return ApplicationError(
        str(error),
        {"code": error.code, "message": error.message, "path": error.path},
        type=error.code,
        non_retryable=True,
    )


def _run_ms(t0: int) -> int:
    return max(0, (workflow.time_ns() - t0) // 1_000_000)


async def run_attempts(
    policy: Union[Policy, Document],
    activity_fn: Union[str, Callable[..., Any]],
    idempotency_key: str,
    *,
    args: Sequence[Any] = (),
    start_to_close_timeout: timedelta = timedelta(seconds=60),
    retry_policy: Optional[RetryPolicy] = None,
    task_queue: Optional[str] = None,
    price_schedule: Optional[Document] = None,
    heartbeat_timeout: Optional[timedelta] = None,
) -> RunOutput:
    """Run one logical request from workflow code: plan each attempt with the
    core, sleep on a workflow timer until its ``not_before_ms``, run it as one
    activity execution (``activity_fn``: an activity made with
    :func:`attempt_activity`, or its name), record its facts and return the
    sealed run. Coded errors (a retry policy of more than one attempt, a
    policy or key the core refuses, a section the core says a workflow
    cannot carry: a fleet ``admission_missing``, a stream contract
    ``stream_record_missing``, an async job ``invalid_async_job``) fail the
    workflow with an ``ApplicationError`` whose type is the code, before the
    first dispatch."""
    try:
        one = check_retry_policy(retry_policy)
        compiled = _checked(policy, idempotency_key)
        # What a workflow's I/O cannot carry (a fleet store, a stream record,
        # a job's id) is the core's refusal (docs/COMPOSITION.md, "What a driver carries").
        compiled._compiled.require_driver("workflow")
        schedule = _schedule_for(compiled, price_schedule)
    except RetryledgerError as e:
        raise _coded(e) from None
    adapter = _WorkflowRun(activity_fn, idempotency_key, list(args), schedule, one, start_to_close_timeout, heartbeat_timeout, task_queue)
    options: Dict[str, Any] = {"origin_epoch_ms": int(workflow.now().timestamp() * 1000)}
    if schedule is not None:
        options["price_schedule"] = json.loads(schedule)
    try:
        machine = Machine.start(compiled, options)
        run = await pump_async(run_loop(machine, adapter), adapter, cancellable=True)
    except RetryledgerError as e:
        raise _coded(e) from None
    value = run.value.value if run.value is not None else None
    return RunOutput(terminal=run.terminal, receipt_sha256=run.receipt_sha256, bundle_json=run.bundle_json, value=value)


class _WorkflowRun(Adapter):
    """A workflow's run as the host loop's adapter: the run clock on
    workflow time, a wait on a workflow timer, each attempt one activity
    execution (its report the attempt's facts), and the workflow's
    cancellation as the caller's."""

    def __init__(
        self,
        activity_fn: Union[str, Callable[..., Any]],
        idempotency_key: str,
        args: List[Any],
        schedule: Optional[str],
        retry_policy: RetryPolicy,
        start_to_close_timeout: timedelta,
        heartbeat_timeout: Optional[timedelta],
        task_queue: Optional[str],
    ) -> None:
        self.activity_fn = activity_fn
        self.key = idempotency_key
        self.args = args
        self.schedule = schedule
        self.retry_policy = retry_policy
        self.start_to_close_timeout = start_to_close_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.task_queue = task_queue
        self.t0 = workflow.time_ns()
        self.was_cancelled = False

    def now_ms(self) -> int:
        return _run_ms(self.t0)

    def cancelled(self) -> bool:
        return self.was_cancelled

    def cancel(self) -> None:
        self.was_cancelled = True

    def cancelled_before_send(self) -> bool:
        return self.was_cancelled

    async def sleep(self, ms: int) -> None:
        await workflow.sleep(timedelta(milliseconds=ms))

    def dispatch(self, effect: Dict[str, Any]) -> Any:
        data = AttemptInput(
            plan=dict(effect["dispatch"], kind="dispatch"),
            idempotency_key=self.key,
            started_at_ms=int(effect["started_at_ms"]),
            args=list(self.args),
            price_schedule=self.schedule,
        )
        return workflow.execute_activity(
            self.activity_fn,  # type: ignore[arg-type]  # a name or the activity function
            data,
            start_to_close_timeout=self.start_to_close_timeout,
            heartbeat_timeout=self.heartbeat_timeout,
            retry_policy=self.retry_policy,
            task_queue=self.task_queue,
            result_type=AttemptReport,
        )

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        wall = int(workflow.now().timestamp() * 1000)
        if not ok:
            if isinstance(reply, asyncio.CancelledError):
                # Cancelled during the attempt: judged as cancelled (never retried).
                self.was_cancelled = True
                return {"facts": {"result": "raised", "cancelled": True, "now_unix_ms": wall}}
            # The activity execution itself failed (timeout, worker lost, cancelled).
            cancelled = isinstance(getattr(reply, "cause", None), TemporalCancelledError)
            self.was_cancelled = self.was_cancelled or cancelled
            return {"facts": facts_of(reply, cancelled=cancelled, now_unix_ms=wall).to_dict()}
        report: AttemptReport = reply
        fields: Dict[str, Any] = {"facts": json.loads(report.facts)}
        if report.cost is not None:
            fields["cost"] = report.cost
        if report.usage is not None:
            fields["usage"] = json.loads(report.usage)
        if report.request_body_sha256 is not None:
            fields["request_body_sha256"] = report.request_body_sha256
        return fields


@workflow.defn(name="retryledger.run")
class RetryledgerWorkflow:
    """A ready workflow: one logical request under a policy (:class:`RunInput`),
    its attempts run by the activity it names; the result is :class:`RunOutput`."""

    @workflow.run
    async def run(self, data: RunInput) -> RunOutput:
        retry_policy = RetryPolicy(maximum_attempts=data.activity_maximum_attempts)
        policy = data.policy if isinstance(data.policy, str) else to_text(data.policy)
        return await run_attempts(
            policy,
            data.activity,
            data.idempotency_key,
            args=data.args,
            start_to_close_timeout=timedelta(milliseconds=data.start_to_close_timeout_ms),
            retry_policy=retry_policy,
            task_queue=data.task_queue,
            price_schedule=data.price_schedule,
        )
