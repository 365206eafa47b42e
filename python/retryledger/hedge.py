"""Hedging (docs/HEDGING.md): a bounded duplicate of the same logical request
after a latency threshold, one winner, every attempt accounted.

:class:`HedgeSession` is the core's hedged state machine, event by event,
with the same methods and plain values as the TypeScript ``HedgeSession``.
Its answer is always what to do now: ``dispatch`` (the round's lead, not
before ``not_before_ms``), ``await`` (the attempts in flight; when ``hedge``
is set, dispatch it at its ``not_before_ms`` unless a result arrives
first), ``cancel`` (the round is decided: cancel these and report each) or
``terminal``. :func:`run_hedged_async` hosts it with asyncio: one task per
attempt, the losers cancelled; every decision is the core's.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Generic, List, Mapping, Optional, Set, Tuple, TypeVar, Union

from . import _core
from ._api import Document, Policy, call, check_integer, to_text
from ._driver import Classifier, _checked, facts_of

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
    """The result of :func:`run_hedged_async`."""

    #: The winner's value; ``None`` unless the run completed.
    result: Optional[T]
    terminal: str
    receipt: Dict[str, Any]
    bundle: Dict[str, Any]
    bundle_json: str
    #: Physical attempts dispatched.
    attempts: int


async def run_hedged_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[HedgeAttempt], Awaitable[T]],
    idempotency_key: str,
    *,
    key_scope: Optional[Tuple[str, str]] = None,
    now: Optional[Callable[[], int]] = None,
    classify: Optional[Classifier] = None,
) -> HedgeRun[T]:
    """Run one logical request under a policy with a hedge section: the lead
    at its earliest start, a hedge at each threshold the core offers unless a
    result arrived first, the first valid success kept, the losers' tasks
    cancelled (a loser that answered anyway is reported late). Exceptions of
    ``dispatch`` are judged by the core like the plain driver's."""
    t0 = time.monotonic()
    clock = now if now is not None else (lambda: int((time.monotonic() - t0) * 1000))
    compiled = _checked(policy, idempotency_key, key_scope)
    session = HedgeSession(compiled)
    deadline_ms = int(compiled.document["deadline_ms"])
    tasks: Dict[int, "asyncio.Task[T]"] = {}
    settled: "asyncio.Queue[tuple[int, int, asyncio.Task[T]]]" = asyncio.Queue()
    values: Dict[int, T] = {}
    cancelled_by_us: Set[int] = set()
    count = 0

    async def attempt(a: HedgeAttempt) -> T:
        return await asyncio.wait_for(dispatch(a), timeout=max(0, deadline_ms - clock()) / 1000)

    def launch(d: Dict[str, Any], hedges: Optional[int]) -> None:
        nonlocal count
        count += 1
        a = HedgeAttempt(
            ordinal=d["ordinal"],
            route_id=d["route_id"],
            idempotency_key=idempotency_key,
            hedges=hedges,
            remaining_ms=max(0, deadline_ms - clock()),
            dispatch=d,
        )
        task = asyncio.ensure_future(attempt(a))
        tasks[a.ordinal] = task
        def done(t: "asyncio.Task[T]", n: int = a.ordinal) -> None:
            if n not in cancelled_by_us:  # a cancelled loser is reported at its cancellation
                settled.put_nowait((n, clock(), t))

        task.add_done_callback(done)

    def report(ordinal: int, at: int, task: "asyncio.Task[T]") -> Step:
        if task.cancelled():
            facts = facts_of(asyncio.CancelledError(), cancelled=True)
            cancelled_step: Step = session.observe(ordinal, at, facts)["step"]
            return cancelled_step
        exc = task.exception()
        if exc is None:
            values[ordinal] = task.result()
            ok_step: Step = session.observe(ordinal, at, {"result": "returned"})["step"]
            return ok_step
        facts = facts_of(exc, classify=classify, now_unix_ms=int(time.time() * 1000))
        failed_step: Step = session.observe(ordinal, at, facts)["step"]
        return failed_step

    async def next_settled(until: Optional[int]) -> Optional[tuple[int, int, "asyncio.Task[T]"]]:
        if not settled.empty():
            return settled.get_nowait()
        timeout = None if until is None else max(0, until - clock()) / 1000
        try:
            return await asyncio.wait_for(settled.get(), timeout=timeout)
        except asyncio.TimeoutError:
            return None

    lead = 0
    try:
        step = session.next()
        while step["kind"] != "terminal":
            if step["kind"] == "dispatch":
                d = step["dispatch"]
                wait = d["not_before_ms"] - clock()
                if wait > 0:
                    await asyncio.sleep(wait / 1000)
                lead = d["ordinal"]
                step = session.start_attempt(d["ordinal"], max(clock(), d["not_before_ms"]))
                launch(d, None)
            elif step["kind"] == "await":
                hedge = step.get("hedge")
                got = await next_settled(None if hedge is None else hedge["not_before_ms"])
                if got is not None:
                    step = report(*got)
                elif hedge is not None and clock() >= hedge["not_before_ms"]:
                    step = session.start_attempt(hedge["ordinal"], clock())
                    launch(hedge, lead)
            else:
                # A loser whose answer already arrived is reported late; the
                # others are cancelled and reported at once (a dispatch that
                # swallows its cancellation cannot hold the run).
                losers = set(step["ordinals"])
                pending: List[tuple[int, int, "asyncio.Task[T]"]] = []
                late: Optional[tuple[int, int, "asyncio.Task[T]"]] = None
                while not settled.empty():
                    item = settled.get_nowait()
                    if late is None and item[0] in losers:
                        late = item
                    else:
                        pending.append(item)
                for item in pending:
                    settled.put_nowait(item)
                if late is not None:
                    step = report(*late)
                    continue
                for n in step["ordinals"]:
                    cancelled_by_us.add(n)
                    tasks[n].cancel()
                    step = session.cancelled(n, clock())
        sealed = session.seal()
        receipt: Dict[str, Any] = sealed["bundle"]["receipt"]
        winner = receipt.get("hedge", {}).get("winner_ordinal")
        return HedgeRun(
            result=None if winner is None else values.get(winner),
            terminal=str(step["terminal"]),
            receipt=receipt,
            bundle=sealed["bundle"],
            bundle_json=sealed["bundle_json"],
            attempts=count,
        )
    finally:
        for t in tasks.values():
            if not t.done():
                t.cancel()
