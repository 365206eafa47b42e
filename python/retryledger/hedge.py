"""Hedging (docs/HEDGING.md): a bounded duplicate of the same logical request
after a latency threshold, one winner, every attempt accounted.

:class:`HedgeSession` is the core's hedged state machine, event by event,
with the same methods and plain values as the TypeScript ``HedgeSession``.
Its answer is always what to do now: ``dispatch`` (the round's lead, not
before ``not_before_ms``), ``await`` (the attempts in flight; when ``hedge``
is set, dispatch it at its ``not_before_ms`` unless a result arrives
first), ``cancel`` (the round is decided: cancel these and report each) or
``terminal``. :func:`run_hedged_async` is an adapter of the host loop
(docs/HOST_LOOP.md) over the run machine's hedge layer, pumped with asyncio:
one task per attempt, the losers cancelled; every decision is the core's.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Generic, List, Mapping, Optional, Set, Tuple, TypeVar, Union

from . import _core
from ._api import Document, Policy, call, check_integer, to_text
from ._driver import (
    AttemptCallback,
    Classifier,
    DecisionCallback,
    SleepCallback,
    TerminalCallback,
    _checked,
    _fleet_for,
    _monotonic_ms,
    _wall_ms,
    facts_of,
)
from ._loop import Machine, pump_async, run_loop
from .machine import FleetAdapter, fleet_options
from .fleet import Fleet

__all__ = ["HedgeAttempt", "HedgeRun", "HedgeSession", "run_hedged_async"]

T = TypeVar("T")

Step = Dict[str, Any]


def _facts_text(facts: Union[_core.Facts, Mapping[str, Any], str]) -> str:
    if isinstance(facts, _core.Facts):
        return facts.json
    return to_text(facts)


class HedgeSession:
    """A hedged run in progress (the policy must have a ``hedge`` section)."""

    __slots__ = ("_raw",)

    def __init__(self, policy: Union[Policy, Document]) -> None:
        text = policy.json if isinstance(policy, Policy) else to_text(policy)
        self._raw: _core.HedgeSession = call(_core.HedgeSession, text)

    def next(self) -> Step:
        """What to do now."""
        step: Step = json.loads(self._raw.next_json())
        return step

    def start_attempt(self, ordinal: int, started_at_ms: int) -> Step:
        """The planned lead, or the hedge on offer, went out at ``started_at_ms`` (run clock)."""
        step: Step = json.loads(call(self._raw.start_attempt, ordinal, started_at_ms))
        return step

    def observe(
        self,
        ordinal: int,
        completed_at_ms: int,
        facts: Union[_core.Facts, Mapping[str, Any], str],
        cost: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Attempt ``ordinal`` ended at ``completed_at_ms``: ``{"judgement", "step"}``."""
        if cost is not None:
            check_integer("cost", cost)
        answer: Dict[str, Any] = json.loads(
            call(self._raw.observe, ordinal, completed_at_ms, cost, _facts_text(facts))
        )
        return answer

    def cancelled(self, ordinal: int, at_ms: int) -> Step:
        """Loser ``ordinal`` was cancelled at ``at_ms`` (charged as the policy says)."""
        step: Step = json.loads(call(self._raw.cancelled, ordinal, at_ms))
        return step

    def admit(self, at_ms: int, now_epoch_ms: int, view: Document) -> Dict[str, Any]:
        """Under a fleet section: admit the lead or the hedge on offer: ``{"step", "writes"}``."""
        answer: Dict[str, Any] = json.loads(call(self._raw.admit, at_ms, now_epoch_ms, to_text(view)))
        return answer

    def cancel(self, at_ms: int) -> None:
        """The caller cancelled the run between rounds at ``at_ms``."""
        call(self._raw.cancel, at_ms)

    @property
    def attempts(self) -> Dict[str, Any]:
        """The attempts of every resolved round."""
        attempts: Dict[str, Any] = json.loads(self._raw.attempts_json())
        return attempts

    def receipt(self) -> Dict[str, Any]:
        """The receipt of the finished run."""
        receipt: Dict[str, Any] = json.loads(call(self._raw.receipt_json))
        return receipt

    def seal(self) -> Dict[str, Any]:
        """``{"bundle", "bundle_json"}`` of the finished run."""
        text = call(self._raw.bundle_json)
        return {"bundle": json.loads(text), "bundle_json": text}


@dataclass(frozen=True)
class HedgeAttempt:
    """What the dispatch function of :func:`run_hedged_async` is given for one attempt."""

    ordinal: int
    route_id: str
    #: The caller's idempotency key: send it on every attempt (every hedge carries the same).
    idempotency_key: str
    #: The ordinal this attempt hedges (``None`` on a lead).
    hedges: Optional[int]
    #: Milliseconds left before the run's deadline when this attempt started.
    remaining_ms: int
    #: The planned dispatch.
    dispatch: Dict[str, Any]


@dataclass(frozen=True)
class HedgeRun(Generic[T]):
    """The result of :func:`run_hedged_async`: the one result shape of every
    driver (``value``, ``receipt``, ``receipt_sha256``, ``bundle``,
    ``bundle_json``), and the winner's value as ``result`` too."""

    #: The winner's value; ``None`` unless the run completed.
    result: Optional[T]
    terminal: str
    receipt: Dict[str, Any]
    bundle: Dict[str, Any]
    bundle_json: str
    #: Physical attempts dispatched.
    attempts: int
    #: Lowercase hex SHA-256 of the receipt's canonical JSON.
    receipt_sha256: str = ""

    @property
    def value(self) -> Optional[T]:
        """The winner's value (the same as ``result``)."""
        return self.result




class _Hedged(FleetAdapter):
    """A hedged run as the host loop's adapter: the caller's dispatch (each
    attempt a task of the pump, wrapped in the run's deadline), the run
    clock and sleep, the fleet store and the hooks."""

    def __init__(
        self,
        compiled: Policy,
        key: str,
        send: Callable[[HedgeAttempt], Awaitable[Any]],
        clock: Callable[[], float],
        sleep: Optional[Callable[[float], Awaitable[None]]],
        wall_clock: Callable[[], float],
        classify: Optional[Classifier],
        fleet: Optional[Fleet],
        hooks: Tuple[
            Optional[DecisionCallback], Optional[SleepCallback], Optional[AttemptCallback], Optional[TerminalCallback]
        ],
    ) -> None:
        self.key = key
        self.send = send
        self.clock = clock
        self.t0 = clock()
        self.pause = sleep
        self.wall_clock = wall_clock
        self.classify = classify
        self.use_fleet(fleet)
        self.deadline_ms = int(compiled.document["deadline_ms"])
        self.hooks = hooks
        #: The attempts sent and not yet answered for, and their round's lead.
        self.open: Set[int] = set()
        #: The attempts cut at the run's deadline.
        self.timed_out: Set[int] = set()
        self.lead = 0
        self.count = 0

    def now_ms(self) -> int:
        return max(0, int(self.clock() - self.t0))

    def sleep(self, ms: int) -> Any:
        if self.pause is not None:
            return self.pause(ms)
        return asyncio.sleep(ms / 1000)

    def dispatch(self, effect: Dict[str, Any]) -> Any:
        d = effect["dispatch"]
        ordinal = int(d["ordinal"])
        # A dispatch while none of the round is open is the round's lead;
        # otherwise it hedges that lead.
        hedges = self.lead if self.open else None
        if hedges is None:
            self.lead = ordinal
        self.open.add(ordinal)
        self.count += 1
        remaining = max(0, self.deadline_ms - self.now_ms())
        attempt = HedgeAttempt(
            ordinal=ordinal,
            route_id=d["route_id"],
            idempotency_key=self.key,
            hedges=hedges,
            remaining_ms=remaining,
            dispatch=d,
        )
        # The attempt is a task from now on, cut at the run's deadline (a
        # timeout, as `asyncio.wait_for` would raise).
        task = asyncio.ensure_future(self.send(attempt))
        at_deadline = asyncio.get_running_loop().call_later(remaining / 1000, self._cut, ordinal, task)
        task.add_done_callback(lambda _t: at_deadline.cancel())
        return task

    def _cut(self, ordinal: int, task: "asyncio.Future[Any]") -> None:
        if not task.done():
            self.timed_out.add(ordinal)
            task.cancel()

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        self.open.discard(int(effect["dispatch"]["ordinal"]))
        if ok:
            return {"facts": {"result": "returned"}}
        if isinstance(reply, asyncio.CancelledError) and int(effect["dispatch"]["ordinal"]) in self.timed_out:
            facts = facts_of(asyncio.TimeoutError(), classify=self.classify, now_unix_ms=int(self.wall_clock()))
        elif isinstance(reply, asyncio.CancelledError):
            facts = facts_of(reply, cancelled=True)
        else:
            facts = facts_of(reply, classify=self.classify, now_unix_ms=int(self.wall_clock()))
        return {"facts": json.loads(facts.json)}

    def cancel_attempt(self, ordinal: int) -> None:
        self.open.discard(ordinal)




async def run_hedged_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[HedgeAttempt], Awaitable[T]],
    idempotency_key: str,
    *,
    key_scope: Optional[Tuple[str, str]] = None,
    now: Optional[Callable[[], int]] = None,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    fleet: Optional[Fleet] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> HedgeRun[T]:
    """Run one logical request under a policy with a hedge section: the lead
    at its earliest start, a hedge at each threshold the core offers unless a
    result arrived first, the first valid success kept, the losers' tasks
    cancelled (a loser that answered anyway is reported late). Exceptions of
    ``dispatch`` are judged by the core like the plain driver's.

    It runs on the host loop over the run machine's hedge layer
    (docs/HOST_LOOP.md), with the options of every driver: ``now`` (the run
    clock, ms since admission) or ``clock`` (monotonic ms) and ``sleep``
    (awaited, ms), ``wall_clock`` (Unix ms), ``fleet`` (every lead and hedge
    admitted first), and the hooks. Cancelling the task cancels the attempts
    in flight and propagates at once."""
    compiled = _checked(policy, idempotency_key, key_scope)
    used = _fleet_for(compiled, fleet)
    run_clock: Callable[[], float] = (lambda: float(now())) if now is not None else (clock or _monotonic_ms)
    adapter = _Hedged(
        compiled,
        idempotency_key,
        dispatch,
        run_clock,
        sleep,
        wall_clock or _wall_ms,
        classify,
        used,
        (on_decision, on_sleep, on_attempt, on_terminal),
    )
    if now is not None:
        adapter.t0 = 0.0
    wall = wall_clock or _wall_ms
    options: Dict[str, Any] = {"origin_epoch_ms": max(0, int(wall()) - adapter.now_ms()), **fleet_options(used)}
    machine = Machine.start(compiled, options)
    run = await pump_async(run_loop(machine, adapter), adapter)
    return HedgeRun(
        result=run.value,
        terminal=run.terminal,
        receipt=run.receipt,
        bundle=run.bundle,
        bundle_json=run.bundle_json,
        attempts=adapter.count,
        receipt_sha256=run.receipt_sha256,
    )
