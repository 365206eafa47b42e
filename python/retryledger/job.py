"""Provider asynchronous jobs (docs/JOBS.md): submit once, then poll by the job's id.

A policy with an ``async_job`` section runs one logical request as a job the
provider holds (OpenAI Responses with ``background=True``, Anthropic Message
Batches). :func:`run_job` hosts the core's plan: every dispatch is a submit
or a poll of the accepted job, when and as often as the core says; a submit
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

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Mapping, Optional, Tuple, TypeVar, Union

from ._api import Document, Policy, _policy_of
from ._driver import (
    AttemptError,
    RunCancelledError,
    RunResult,
    RunStoppedError,
    Step,
    run as _run,
    run_async as _run_async,
)
from ._errors import PolicyError
from ._integration import require_max_retries_zero

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


def _job_policy(policy: Union[Policy, Document], cancel: Optional[Callable[..., Any]]) -> Tuple[Policy, bool]:
    """The compiled policy, refused (``invalid_async_job``) without an
    ``async_job`` section, with a ``fleet`` section, or with
    ``cancel_left_running`` and no ``calls.cancel``; and whether the core
    plans the cancel."""
    compiled = _policy_of(policy)
    section = compiled.document.get("async_job")
    if section is None:
        raise PolicyError("invalid_async_job", "a job runs under a policy with an async_job section", "/async_job")
    if compiled.document.get("fleet") is not None:
        # The run machine admits a job's submit under a fleet; this driver
        # admits nothing, so it refuses before any request.
        raise PolicyError("invalid_async_job", "the job driver admits nothing: a job under a fleet section runs through the run machine", "/fleet")
    planned = section.get("cancel_left_running") is True
    if planned and cancel is None:
        raise PolicyError(
            "invalid_async_job",
            "the run plans the cancel of a job left running: calls.cancel is required",
            "/async_job/cancel_left_running",
        )
    return compiled, planned


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
    cancelled after sealing (when ``calls.cancel`` is given), unrecorded."""
    compiled, planned_cancel = _job_policy(policy, calls.cancel)
    job_id: Optional[str] = None
    last: Optional[JobAnswer[R]] = None

    def dispatch(step: Step) -> JobAnswer[R]:
        nonlocal job_id, last
        planned = step.plan.job
        if planned is None:
            raise TypeError("run_job needs a policy with an async_job section")
        if planned["kind"] == "cancel":
            # The planned cancel of the job the run leaves running: sent
            # once, its outcome recorded; the run then ends with the
            # terminal that planned it. The job's last answer stays the run's.
            assert job_id is not None and calls.cancel is not None and last is not None
            calls.cancel(job_id)
            step.job(job_id, None)
            return last
        if planned["kind"] == "submit":
            try:
                answer = calls.submit(step)
            except Exception as e:
                if calls.reconcile is None:
                    raise
                found = calls.reconcile(step, e)
                step.reconciled(found.answer)
                if found.answer != "succeeded" or found.job is None:
                    raise
                answer = found.job
            step.job(answer.id, answer.status)
            if answer.id is not None:
                job_id = answer.id
            last = answer
            return answer
        # The core plans polls only after an acceptance, which set the id.
        assert job_id is not None
        answer = calls.poll(job_id, step)
        step.job(job_id, answer.status)
        last = answer
        return answer

    try:
        return _run(compiled, dispatch, idempotency_key, **options)
    except RunStoppedError as e:
        job = e.receipt.get("job") or {}
        if not planned_cancel and job.get("left_running") and job_id is not None and calls.cancel is not None:
            calls.cancel(job_id)
        raise


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
    compiled, planned_cancel = _job_policy(policy, calls.cancel)
    job_id: Optional[str] = None
    last: Optional[JobAnswer[R]] = None

    async def dispatch(step: Step) -> JobAnswer[R]:
        nonlocal job_id, last
        planned = step.plan.job
        if planned is None:
            raise TypeError("run_job_async needs a policy with an async_job section")
        if planned["kind"] == "cancel":
            assert job_id is not None and calls.cancel is not None and last is not None
            await calls.cancel(job_id)
            step.job(job_id, None)
            return last
        if planned["kind"] == "submit":
            try:
                answer = await calls.submit(step)
            except Exception as e:
                if calls.reconcile is None:
                    raise
                found = await calls.reconcile(step, e)
                step.reconciled(found.answer)
                if found.answer != "succeeded" or found.job is None:
                    raise
                answer = found.job
            step.job(answer.id, answer.status)
            if answer.id is not None:
                job_id = answer.id
            last = answer
            return answer
        assert job_id is not None
        answer = await calls.poll(job_id, step)
        step.job(job_id, answer.status)
        last = answer
        return answer

    try:
        return await _run_async(compiled, dispatch, idempotency_key, **options)
    except (RunStoppedError, RunCancelledError) as e:
        job = e.receipt.get("job") or {}
        if not planned_cancel and job.get("left_running") and job_id is not None and calls.cancel is not None:
            await calls.cancel(job_id)
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
