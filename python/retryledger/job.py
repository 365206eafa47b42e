"""Provider asynchronous jobs (docs/JOBS.md): submit once, then poll by the job's id.

A policy with an ``async_job`` section runs one logical request as a job the
provider holds (OpenAI Responses with ``background=True``, Anthropic Message
Batches). :func:`run_job` hosts the core's plan, an adapter of the host loop
over the run machine's job layer (docs/HOST_LOOP.md): every dispatch is a
submit or a poll of the accepted job, when and as often as the core says; a submit
whose answer was lost stops ``stop_indeterminate`` and is never sent again.
Under the section's ``cancel_left_running`` the core plans the cancel of a
job the run would leave running, and ``calls.cancel`` is that step (recorded
as the run's last attempt); without it, when the run ends with the job still
running (the receipt's ``job.left_running``), the job is cancelled at the
provider after sealing, unrecorded.

    client = openai.OpenAI(max_retries=0)
    result = run_job(policy, openai_responses_job(client, {"model": ..., "input": ...}), key)
    result.value.value.output_text
"""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Generic, List, Mapping, Optional, Tuple, TypeVar, Union

from . import _core
from ._api import Document, Policy, _policy_of
from ._driver import (
    AttemptError,
    Classifier,
    MachineStep,
    RunCancelledError,
    RunResult,
    RunStoppedError,
    Step,
    UnrecognizedDispatchError,
    _async_sleep_ms,
    _checked,
    _fleet_for,
    _monotonic_ms,
    _reserve,
    _schedule_for,
    _sleep_ms,
    _wall_ms,
    facts_of,
)
from ._errors import DecodeError
from ._integration import require_max_retries_zero
from ._loop import LoopResult, Machine, pump, pump_async, run_loop
from .fleet import Fleet
from .machine import FleetAdapter, fleet_options
from .journaled import _MachineSealed

__all__ = [
    "JobAnswer",
    "JobCalls",
    "AsyncJobCalls",
    "Reconciliation",
    "run_job",
    "run_job_async",
    "openai_responses_job",
    "openai_responses_job_async",
    "anthropic_batch_job",
    "anthropic_batch_job_async",
]

R = TypeVar("R")


@dataclass(frozen=True)
class JobAnswer(Generic[R]):
    """What a submit or a poll answered: the job's status (``queued``,
    ``in_progress``, ``completed``, ``failed``, ``cancelled``, ``incomplete``,
    ``expired``), for a submit its id, and the provider's answer itself."""

    status: str
    value: R
    id: Optional[str] = None


@dataclass(frozen=True)
class JobCalls(Generic[R]):
    """The provider calls of an async job: ``submit(step)`` answers the job's
    id and status, ``poll(job_id, step)`` retrieves it, ``cancel(job_id)``
    (optional; required under ``cancel_left_running``, where it is the
    planned ``cancel`` step) cancels it at the provider."""

    submit: Callable[[Step], JobAnswer[R]]
    poll: Callable[[str, Step], JobAnswer[R]]
    cancel: Optional[Callable[[str], Any]] = None
    #: Ask the provider, by the run's idempotency key, what became of a
    #: submit whose answer was lost (it raised): a :class:`Reconciliation`.
    #: Without it a lost submit answer stops the run ``stop_indeterminate``.
    reconcile: Optional[Callable[[Step, BaseException], "Reconciliation[R]"]] = None


@dataclass(frozen=True)
class Reconciliation(Generic[R]):
    """What a reconciliation of a lost submit answer found: ``succeeded``
    (the job was accepted: ``job`` holds its id and status, and polls
    follow), ``failed_no_effect`` (nothing was accepted: another submit may
    follow) or ``unknown`` (the run stops ``stop_indeterminate``)."""

    answer: str
    job: Optional[JobAnswer[R]] = None


def _job_policy(policy: Union[Policy, Document], cancel: Optional[Callable[..., Any]]) -> Policy:
    """The compiled policy, refused by the core (``invalid_async_job``)
    without an ``async_job`` section or with ``cancel_left_running`` and no
    ``calls.cancel``."""
    compiled = _policy_of(policy)
    compiled._compiled.require_driver("job")
    compiled._compiled.require_job_calls(cancel is not None)
    return compiled


class _JobStep(MachineStep):
    """The :class:`Step` of a job's attempt: the job id and status it
    reports, and a lost submit's reconciliation, go into the ``observed``
    event with what every step reports."""

    _job: Optional[Tuple[Optional[str], Optional[str]]] = None
    _reconciled: Optional[str] = None

    def job(self, id: Optional[str], status: Optional[str]) -> None:
        self._job = (id, status)

    def reconciled(self, answer: str) -> None:
        self._reconciled = answer

    def observation(self, ok: bool, reply: Any, classify: Optional[Classifier], now_unix_ms: int) -> Dict[str, Any]:
        fields = super().observation(ok, reply, classify, now_unix_ms)
        if self._job is not None:
            if self._job[0] is not None:
                fields["job_id"] = self._job[0]
            if self._job[1] is not None:
                fields["job_status"] = self._job[1]
        if self._reconciled is not None:
            fields["reconciled"] = self._reconciled
        if self._tokens is not None:
            fields["used_tokens"] = self._tokens
        return fields


_RUN_OPTIONS = frozenset(
    {"classify", "clock", "sleep", "wall_clock", "on_attempt", "on_cancel", "key_scope", "price_schedule",
     "fleet", "reserve_tokens", "on_decision", "on_sleep", "on_terminal", "checks", "repair", "request"}
)


class _JobRun(FleetAdapter):
    """An async job as the host loop's adapter: each ``dispatch``, ``poll``
    and ``cancel`` effect is the provider call it names, with the job id the
    submit's answer gave; what each answered goes back in the observation,
    and the core decides what comes next."""

    def __init__(
        self, calls: Any, idempotency_key: str, schedule: Optional[str], options: Mapping[str, Any], sync: bool, fleet: Optional[Fleet]
    ) -> None:
        unknown = sorted(set(options) - _RUN_OPTIONS)
        if unknown:
            raise TypeError(f"run_job() got an unexpected keyword argument {unknown[0]!r}")
        if options.get("repair") is not None:
            raise DecodeError("invalid_value", "an async job's run is not repaired", "/repair")
        self.calls = calls
        self.key = idempotency_key
        self.schedule = schedule
        self.classify: Optional[Classifier] = options.get("classify")
        self.clock: Callable[[], float] = options.get("clock") or _monotonic_ms
        self.t0 = self.clock()
        self.pause = options.get("sleep") or (_sleep_ms if sync else _async_sleep_ms)
        self.wall_clock: Callable[[], float] = options.get("wall_clock") or _wall_ms
        self.checks = options.get("checks")
        self.hooks = (options.get("on_decision"), options.get("on_sleep"), options.get("on_attempt"), options.get("on_terminal"))
        # Under a fleet section the submit is admitted against the fleet's
        # store (the machine's `read` and `write`); polls and the cancel are not.
        self.use_fleet(fleet)
        self.step: Optional[_JobStep] = None
        self.job_id: Optional[str] = None
        self.last: Any = None
        self.last_error: Optional[BaseException] = None
        self.rule: Any = None
        self.was_cancelled = False

    def now_ms(self) -> int:
        return max(0, int(self.clock() - self.t0))

    def sleep(self, ms: int) -> Any:
        return self.pause(ms)

    def cancelled(self) -> bool:
        return self.was_cancelled

    def cancel(self) -> None:
        self.was_cancelled = True

    def cancelled_before_send(self) -> bool:
        return self.was_cancelled

    def dispatch(self, effect: Dict[str, Any]) -> Any:
        step = _JobStep(effect, self.key, self.schedule)
        self.step = step
        kind = effect["kind"]
        calls = self.calls
        if kind == "cancel":
            # The planned cancel of the job the run leaves running: sent once,
            # its outcome recorded; the job's last answer stays the run's.
            assert self.job_id is not None and calls.cancel is not None
            job_id = self.job_id

            def cancelled(_: Any) -> Any:
                step.job(job_id, None)
                return self.last

            return _then(calls.cancel(job_id), cancelled)
        if kind == "poll":
            # The core plans polls only after an acceptance, which set the id.
            assert self.job_id is not None
            job_id = self.job_id

            def polled(answer: JobAnswer[Any]) -> JobAnswer[Any]:
                step.job(job_id, answer.status)
                self.last = answer
                return answer

            return _then(_call(lambda: calls.poll(job_id, step)), polled)

        def accepted(answer: JobAnswer[Any]) -> JobAnswer[Any]:
            step.job(answer.id, answer.status)
            if answer.id is not None:
                self.job_id = answer.id
            self.last = answer
            return answer

        def lost(e: BaseException) -> Any:
            if calls.reconcile is None:
                raise e

            def found(f: "Reconciliation[Any]") -> JobAnswer[Any]:
                step.reconciled(f.answer)
                if f.answer != "succeeded" or f.job is None:
                    raise e
                return f.job

            return _then(calls.reconcile(step, e), found)

        return _then(_call(lambda: calls.submit(step), lost), accepted)

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        step = self.step
        assert step is not None
        cancelled = effect["kind"] != "cancel" and self.was_cancelled
        if ok:
            self.last_error = None
        else:
            self.last_error = reply
        if not ok and (cancelled or isinstance(reply, asyncio.CancelledError)):
            fields = step.observation(True, None, None, 0)
            fields["facts"] = facts_of(reply, cancelled=True).to_dict()
            return fields
        fields = step.observation(ok, reply, self.classify, max(0, int(self.wall_clock())))
        if ok and self.checks is not None and effect["kind"] != "cancel":
            try:
                verdicts = [check(reply) for check in self.checks]
                fields["facts"] = _core.Facts(result="returned", output_checks=verdicts).to_dict()
            except Exception as e:
                # A check that raises leaves the attempt unrecognized.
                self.last_error = e
                fields["facts"] = {"result": "raised", "error_types": ["OutputCheckError"]}
        return fields

    def on_attempt(self, attempt: Dict[str, Any], judgement: Dict[str, Any]) -> None:
        self.rule = judgement["rule"]
        super().on_attempt(attempt, judgement)


def _call(f: Callable[[], Any], on_error: Optional[Callable[[BaseException], Any]] = None) -> Any:
    """``f()``, or ``on_error`` of what it raised (awaited when ``f`` gave a coroutine)."""
    try:
        got = f()
    except Exception as e:
        if on_error is None:
            raise
        return on_error(e)
    if inspect.isawaitable(got):

        async def awaited() -> Any:
            try:
                value = await got
            except Exception as e:
                if on_error is None:
                    raise
                value = on_error(e)
            return (await value) if inspect.isawaitable(value) else value

        return awaited()
    return got


def _then(got: Any, f: Callable[[Any], Any]) -> Any:
    """``f`` of ``got``, awaited first when it is awaitable."""
    if inspect.isawaitable(got):

        async def awaited() -> Any:
            value = await got
            out = f(value)
            return (await out) if inspect.isawaitable(out) else out

        return awaited()
    return f(got)


def _start(policy: Union[Policy, Document], calls: Any, idempotency_key: str, options: Mapping[str, Any], sync: bool) -> Tuple[Machine, _JobRun]:
    compiled = _job_policy(policy, calls.cancel)
    compiled = _checked(compiled, idempotency_key, options.get("key_scope"))
    fleet = _fleet_for(compiled, options.get("fleet"))
    schedule = _schedule_for(compiled, options.get("price_schedule"))
    adapter = _JobRun(calls, idempotency_key, schedule, options, sync, fleet)
    machine_options: Dict[str, Any] = {"origin_epoch_ms": max(0, int(adapter.wall_clock()) - adapter.now_ms())}
    if schedule is not None:
        machine_options["price_schedule"] = json.loads(schedule)
    machine_options.update(fleet_options(fleet))
    reserve = _reserve(options.get("reserve_tokens"))
    if fleet is not None and reserve is not None:
        machine_options["reserve_tokens"] = reserve
    return Machine.start(compiled, machine_options), adapter


def _ended(adapter: _JobRun, run: LoopResult) -> RunResult[Any]:
    """The run's result, or the error it ended with (cancelled, unrecognized, stopped)."""
    sealed: Any = _MachineSealed(run)
    if run.terminal == "completed":
        return RunResult(run.value, sealed)
    count = run.receipt["attempt_count"]
    message = f"run ended with {run.terminal} after {count} attempt{'s' if count != 1 else ''}"
    if adapter.was_cancelled:
        raise RunCancelledError(sealed)
    if adapter.rule == "unrecognized":
        raise UnrecognizedDispatchError(sealed, f"{message}; unrecognized {type(adapter.last_error).__name__}") from adapter.last_error
    raise RunStoppedError(sealed, message) from adapter.last_error


def _left_running(adapter: _JobRun, receipt: Mapping[str, Any]) -> bool:
    """The core's receipt says the job is left running and no cancel of it
    was planned: it is cancelled now, unrecorded."""
    job = receipt.get("job") or {}
    return bool(
        job.get("left_running") and "cancel" not in job and adapter.job_id is not None and adapter.calls.cancel is not None
    )


def run_job(
    policy: Union[Policy, Document],
    calls: JobCalls[R],
    idempotency_key: str,
    **options: Any,
) -> RunResult[JobAnswer[R]]:
    """Run one logical request as a provider's asynchronous job under a policy
    with an ``async_job`` section; the keyword options are
    :func:`retryledger.run`'s. Returns the answer that completed the job;
    raises :class:`RunStoppedError` otherwise. Under ``cancel_left_running``
    the planned cancel of a job the run would leave running is sent through
    ``calls.cancel`` and recorded; without it a job the run left running is
    cancelled after sealing (when ``calls.cancel`` is given), unrecorded.
    Under a fleet section (``fleet=``, required then) the submit is admitted
    against the fleet's store like any attempt (its route's breaker, the
    retry budget, admission limits) and its outcome settled there; polls and
    the cancel ask about the job the provider holds and are not admitted.
    The run goes through the host loop over the run machine's job layer."""
    machine, adapter = _start(policy, calls, idempotency_key, options, True)
    run = pump(run_loop(machine, adapter), adapter)
    if run.terminal != "completed" and _left_running(adapter, run.receipt):
        assert calls.cancel is not None and adapter.job_id is not None
        calls.cancel(adapter.job_id)
    return _ended(adapter, run)


@dataclass(frozen=True)
class AsyncJobCalls(Generic[R]):
    """:class:`JobCalls` for :func:`run_job_async`: every call is awaited."""

    submit: Callable[[Step], Awaitable[JobAnswer[R]]]
    poll: Callable[[str, Step], Awaitable[JobAnswer[R]]]
    cancel: Optional[Callable[[str], Awaitable[Any]]] = None
    reconcile: Optional[Callable[[Step, BaseException], Awaitable["Reconciliation[R]"]]] = None


async def run_job_async(
    policy: Union[Policy, Document],
    calls: AsyncJobCalls[R],
    idempotency_key: str,
    **options: Any,
) -> RunResult[JobAnswer[R]]:
    """:func:`run_job` for coroutines; the keyword options are
    :func:`retryledger.run_async`'s (``sleep`` awaited). A task cancelled
    while the accepted job is still running raises
    :class:`retryledger.RunCancelledError`: under ``cancel_left_running``
    after the planned cancel was sent through ``calls.cancel`` and recorded
    as the run's last attempt; without it the job is cancelled after sealing
    (when ``calls.cancel`` is given), unrecorded."""
    machine, adapter = _start(policy, calls, idempotency_key, options, False)
    run = await pump_async(run_loop(machine, adapter), adapter, cancellable=True)
    if run.terminal != "completed" and _left_running(adapter, run.receipt):
        assert calls.cancel is not None and adapter.job_id is not None
        await calls.cancel(adapter.job_id)
    try:
        return _ended(adapter, run)
    except RunCancelledError as error:
        on_cancel = options.get("on_cancel")
        if on_cancel is not None:
            on_cancel(error)
        raise


def _outside_the_set(message: str) -> AttemptError:
    """A provider answer outside its documented shape: a protocol violation, never retried."""
    return AttemptError.non_retryable("protocol_violation", message)


_OPENAI_STATUS = ("queued", "in_progress", "completed", "failed", "cancelled", "incomplete")


def _response_status(response: Any) -> Tuple[Optional[str], str]:
    status = getattr(response, "status", None)
    if status not in _OPENAI_STATUS:
        raise _outside_the_set(f"a response status outside the documented set: {status!r}")
    rid = getattr(response, "id", None)
    return (rid if isinstance(rid, str) else None), str(status)


def openai_responses_job(client: Any, params: Mapping[str, Any]) -> JobCalls[Any]:
    """The calls of an OpenAI Responses request run in the background
    (``background=True``): create, retrieve by id, cancel. Refuses, before any
    request, a client whose ``max_retries`` is not 0 (``PolicyError``
    ``retry_owner_not_harness``); every call sends the run's remaining time as
    its timeout, and the create sends the idempotency key."""
    require_max_retries_zero(client, "openai")

    def submit(step: Step) -> JobAnswer[Any]:
        response = client.responses.create(
            **dict(params),
            background=True,
            timeout=max(step.remaining_ms, 1) / 1000.0,
            extra_headers={"Idempotency-Key": step.idempotency_key},
        )
        rid, status = _response_status(response)
        return JobAnswer(status=status, value=response, id=rid)

    def poll(job_id: str, step: Step) -> JobAnswer[Any]:
        response = client.responses.retrieve(job_id, timeout=max(step.remaining_ms, 1) / 1000.0)
        return JobAnswer(status=_response_status(response)[1], value=response)

    def cancel(job_id: str) -> Any:
        return client.responses.cancel(job_id)

    return JobCalls(submit=submit, poll=poll, cancel=cancel)


def openai_responses_job_async(client: Any, params: Mapping[str, Any]) -> AsyncJobCalls[Any]:
    """:func:`openai_responses_job` for an ``openai.AsyncOpenAI`` client and
    :func:`run_job_async`."""
    require_max_retries_zero(client, "openai")

    async def submit(step: Step) -> JobAnswer[Any]:
        response = await client.responses.create(
            **dict(params),
            background=True,
            timeout=max(step.remaining_ms, 1) / 1000.0,
            extra_headers={"Idempotency-Key": step.idempotency_key},
        )
        rid, status = _response_status(response)
        return JobAnswer(status=status, value=response, id=rid)

    async def poll(job_id: str, step: Step) -> JobAnswer[Any]:
        response = await client.responses.retrieve(job_id, timeout=max(step.remaining_ms, 1) / 1000.0)
        return JobAnswer(status=_response_status(response)[1], value=response)

    async def cancel(job_id: str) -> Any:
        return await client.responses.cancel(job_id)

    return AsyncJobCalls(submit=submit, poll=poll, cancel=cancel)


#: An ended batch request's result type as a job status.
_RESULT_STATUS = {"succeeded": "completed", "errored": "failed", "canceled": "cancelled", "expired": "expired"}


def _batch_status(batch: Any) -> Tuple[Optional[str], str]:
    """A batch's ``processing_status`` as a job status (``ended``: its request's result decides)."""
    status = getattr(batch, "processing_status", None)
    bid = getattr(batch, "id", None)
    if status in ("in_progress", "canceling"):
        return (bid if isinstance(bid, str) else None), "in_progress"
    if status == "ended":
        return (bid if isinstance(bid, str) else None), "ended"
    raise _outside_the_set(f"a batch processing_status outside the documented set: {status!r}")


def anthropic_batch_job(client: Any, params: Mapping[str, Any], custom_id: str = "request") -> JobCalls[Any]:
    """The calls of one Anthropic Messages request run as a Message Batch of
    one request (``custom_id``): create, retrieve by id (and, once the batch
    ``ended``, its request's result: ``succeeded`` is ``completed``,
    ``errored`` ``failed``, ``canceled`` ``cancelled``, ``expired``
    ``expired``), cancel. Refuses, before any request, a client whose
    ``max_retries`` is not 0. A completed job's value is the request's
    result (``result.message`` holds the message)."""
    require_max_retries_zero(client, "anthropic")
    batches = client.messages.batches

    def submit(step: Step) -> JobAnswer[Any]:
        batch = batches.create(
            requests=[{"custom_id": custom_id, "params": dict(params)}],
            timeout=max(step.remaining_ms, 1) / 1000.0,
            extra_headers={"Idempotency-Key": step.idempotency_key},
        )
        bid, status = _batch_status(batch)
        # A batch that ended at once is polled for its result.
        return JobAnswer(status="in_progress" if status == "ended" else status, value=batch, id=bid)

    def poll(job_id: str, step: Step) -> JobAnswer[Any]:
        timeout = max(step.remaining_ms, 1) / 1000.0
        batch = batches.retrieve(job_id, timeout=timeout)
        status = _batch_status(batch)[1]
        if status != "ended":
            return JobAnswer(status=status, value=batch)
        for entry in batches.results(job_id, timeout=timeout):
            if getattr(entry, "custom_id", None) != custom_id:
                continue
            kind = getattr(getattr(entry, "result", None), "type", None)
            mapped = _RESULT_STATUS.get(kind) if isinstance(kind, str) else None
            if mapped is None:
                raise _outside_the_set(f"a batch result type outside the documented set: {kind!r}")
            return JobAnswer(status=mapped, value=entry.result)
        raise _outside_the_set(f"the ended batch has no result for {custom_id}")

    def cancel(job_id: str) -> Any:
        return batches.cancel(job_id)

    return JobCalls(submit=submit, poll=poll, cancel=cancel)


def anthropic_batch_job_async(
    client: Any, params: Mapping[str, Any], custom_id: str = "request"
) -> AsyncJobCalls[Any]:
    """:func:`anthropic_batch_job` for an ``anthropic.AsyncAnthropic`` client
    and :func:`run_job_async`."""
    require_max_retries_zero(client, "anthropic")
    batches = client.messages.batches

    async def submit(step: Step) -> JobAnswer[Any]:
        batch = await batches.create(
            requests=[{"custom_id": custom_id, "params": dict(params)}],
            timeout=max(step.remaining_ms, 1) / 1000.0,
            extra_headers={"Idempotency-Key": step.idempotency_key},
        )
        bid, status = _batch_status(batch)
        return JobAnswer(status="in_progress" if status == "ended" else status, value=batch, id=bid)

    async def poll(job_id: str, step: Step) -> JobAnswer[Any]:
        timeout = max(step.remaining_ms, 1) / 1000.0
        batch = await batches.retrieve(job_id, timeout=timeout)
        status = _batch_status(batch)[1]
        if status != "ended":
            return JobAnswer(status=status, value=batch)
        async for entry in await batches.results(job_id, timeout=timeout):
            if getattr(entry, "custom_id", None) != custom_id:
                continue
            kind = getattr(getattr(entry, "result", None), "type", None)
            mapped = _RESULT_STATUS.get(kind) if isinstance(kind, str) else None
            if mapped is None:
                raise _outside_the_set(f"a batch result type outside the documented set: {kind!r}")
            return JobAnswer(status=mapped, value=entry.result)
        raise _outside_the_set(f"the ended batch has no result for {custom_id}")

    async def cancel(job_id: str) -> Any:
        return await batches.cancel(job_id)

    return AsyncJobCalls(submit=submit, poll=poll, cancel=cancel)
