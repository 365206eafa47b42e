"""The async plain driver (``run_async``) as an adapter of the host loop
(docs/HOST_LOOP.md): the caller's dispatch once per planned attempt, the
run clock and sleep and the hooks; what each attempt reported (cost,
usage, request body, model, tokens) goes back in its observation, and the
core decides what comes next. A run with a fleet keeps the session's loop
(``_driver``) until the machine's fleet layer admits through the fleet's
one check-and-set."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from . import _core
from ._api import Document, Policy
from ._driver import (
    MachineStep,
    RunCancelledError,
    RunResult,
    RunStoppedError,
    UnrecognizedDispatchError,
    _async_sleep_ms,
    _checked,
    _fleet_for,
    _monotonic_ms,
    _schedule_for,
    _wall_ms,
    facts_of,
)
from ._loop import LoopResult, Machine, pump_async, run_loop
from .journaled import _MachineSealed
from .machine import HookedAdapter

#: The facts of a returned answer whose output checks broke: unrecognized, never retried.
_CHECK_BROKE = {"result": "raised", "error_types": ["OutputCheckError"]}


class _Plain(HookedAdapter):
    """A plain run as the host loop's adapter."""

    announces_plans = True

    def __init__(
        self,
        compiled: Policy,
        key: str,
        send: Callable[[Any], Any],
        schedule: Optional[str],
        options: Mapping[str, Any],
    ) -> None:
        self.compiled = compiled
        self.key = key
        self.send = send
        self.schedule = schedule
        self.classify = options.get("classify")
        self.clock: Callable[[], float] = options.get("clock") or _monotonic_ms
        self.t0 = self.clock()
        self.pause = options.get("sleep") or _async_sleep_ms
        self.wall_clock: Callable[[], float] = options.get("wall_clock") or _wall_ms
        checks = options.get("checks")
        self.checks = tuple(checks) if checks else None
        self.hooks = (options.get("on_decision"), options.get("on_sleep"), options.get("on_attempt"), options.get("on_terminal"))
        self.step: Optional[MachineStep] = None
        self.last_error: Optional[BaseException] = None
        self.was_cancelled = False
        #: The rule the last observation was judged by.
        self.rule: Any = None

    def now_ms(self) -> int:
        t = int(self.clock() - self.t0)
        return t if t > 0 else 0

    def sleep(self, ms: int) -> Any:
        return self.pause(ms)

    def cancelled(self) -> bool:
        return self.was_cancelled

    def cancel(self) -> None:
        self.was_cancelled = True

    def cancelled_before_send(self) -> bool:
        return self.was_cancelled

    def dispatch(self, effect: Dict[str, Any]) -> Any:
        step = MachineStep(effect, self.key, self.schedule)
        step._compiled = self.compiled._compiled
        self.step = step
        return self.send(step)

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        step = self.step
        assert step is not None
        # A call the attempt refused to send (request_drift) stops the run
        # with that error, whatever the SDK wrapped it in: nothing was sent.
        if step._refused is not None:
            raise step._refused
        cancelled = not ok and effect["kind"] != "cancel" and (self.was_cancelled or isinstance(reply, asyncio.CancelledError))
        if cancelled:
            # The attempt's task was cancelled (from within, or with the run's): the run is cancelled.
            self.was_cancelled = True
        if ok:
            self.last_error = None
            fields = step.observation(True, None, None, 0)
            if self.checks is not None and effect["kind"] != "cancel":
                try:
                    verdicts = [check(reply) for check in self.checks]
                    fields["facts"] = _core.Facts(result="returned", output_checks=verdicts).to_dict()
                except Exception as e:  # the validator broke: recorded, never retried
                    self.last_error = e
                    fields["facts"] = dict(_CHECK_BROKE)
        elif cancelled:
            self.last_error = None
            fields = step.observation(True, None, None, 0)
            fields["facts"] = facts_of(reply, cancelled=True, output_delivered=step._delivered).to_dict()
        else:
            self.last_error = reply
            wall = int(self.wall_clock())
            fields = step.observation(False, reply, self.classify, wall if wall > 0 else 0)
        if step._tokens is not None:
            fields["used_tokens"] = step._tokens
        return fields

    def on_attempt(self, attempt: Dict[str, Any], judgement: Dict[str, Any]) -> None:
        self.rule = judgement["rule"]
        super().on_attempt(attempt, judgement)


def _start(
    policy: Union[Policy, Document], dispatch: Callable[[Any], Any], idempotency_key: str, options: Mapping[str, Any]
) -> Tuple[Machine, _Plain]:
    compiled = _checked(policy, idempotency_key, options.get("key_scope"))
    schedule = _schedule_for(compiled, options.get("price_schedule"))
    # A policy with a fleet section needs a fleet (``admission_missing``);
    # a fleet run keeps the session's loop (``_driver``).
    _fleet_for(compiled, None)
    adapter = _Plain(compiled, idempotency_key, dispatch, schedule, options)
    origin = max(0, int(adapter.wall_clock()) - adapter.now_ms())
    # The options' JSON, written here: the one field of a run without a price schedule.
    machine_options = f'{{"origin_epoch_ms":{origin}}}' if schedule is None else f'{{"origin_epoch_ms":{origin},"price_schedule":{schedule}}}'
    return Machine.start(compiled, machine_options), adapter


def _ended(adapter: _Plain, run: LoopResult) -> RunResult[Any]:
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


async def run_plain_async(
    policy: Union[Policy, Document], dispatch: Callable[[Any], Any], idempotency_key: str, options: Mapping[str, Any]
) -> RunResult[Any]:
    """``run_async`` on the host loop: a cancellation of the task is the
    caller's cancellation of the run (the attempt in flight is judged
    cancelled, and the machine says how the run ends)."""
    machine, adapter = _start(policy, dispatch, idempotency_key, options)
    run = await pump_async(run_loop(machine, adapter), adapter, cancellable=True)
    try:
        return _ended(adapter, run)
    except RunCancelledError as error:
        on_cancel = options.get("on_cancel")
        if on_cancel is not None:
            on_cancel(error)
        raise
