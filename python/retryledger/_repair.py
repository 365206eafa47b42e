"""Bounded repair: the runs of a request and its repairs (docs/REPAIR.md).

``run(..., repair=fn)`` lands here. Each run of the chain is an ordinary
run of the drivers, under the policy the core derives for it
(:func:`retryledger.next_repair`: the repair's request and key digests, the
deadline and the cost left). After a run that stopped on invalid output,
``repair(output, defects)`` builds the next logical request; the core
decides whether a repair may follow at all and under which key
(``repair_step``). Nothing here decides a budget.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from . import _core
from ._api import Policy, call, next_repair, request_sha256, to_text
from ._driver import RunResult, RunStoppedError, Step, _monotonic_ms, _sleep_ms, _async_sleep_ms
from ._errors import DecodeError, DriftError, RetryledgerError
from .checks import defects_of

T = TypeVar("T")

Repair = Callable[[Any, List[Dict[str, Any]]], Any]

#: No repair may follow (the core's answer): the run's own error stands.
_NO_REPAIR = frozenset(
    {"repair_not_allowed", "repair_over_budget", "repair_after_terminal", "repair_same_request", "repair_chain_drift"}
)


class _Seen:
    """The last output the checks saw and their verdicts."""

    __slots__ = ("output", "verdicts")

    def __init__(self) -> None:
        self.output: Any = None
        self.verdicts: List[Dict[str, Any]] = []

    def wrap(self, check: Callable[[Any], Any], first: bool) -> Callable[[Any], Any]:
        def seen(output: Any) -> Any:
            if first:  # a new answer: its own verdicts only
                self.verdicts = []
            verdict = check(output)
            self.output = output
            self.verdicts.append(verdict)
            return verdict

        return seen


class _Chain:
    """The chain so far and the next run's policy, key and request."""

    def __init__(self, policy: Any, key: str, request: Any, key_scope: Optional[Tuple[str, str]], clock: Callable[[], float]) -> None:
        self.links: List[Dict[str, Any]] = []
        self.policy = policy
        self.root_key = key
        self.key = key
        self.request = request
        self.ordinal = 0
        self.scope = key_scope
        self.clock = clock
        self.t0 = clock()
        self.started = 0
        #: The repair that may follow the last run, as the core named it (``repair_step``).
        self.step: Dict[str, Any] = {}

    def elapsed(self) -> int:
        t = int(self.clock() - self.t0)
        return t if t > 0 else 0

    def document(self) -> Dict[str, Any]:
        return {"links": list(self.links), "schema": "retryledger.repair_chain.v1"}

    def add(self, bundle: Dict[str, Any]) -> None:
        link: Dict[str, Any] = {"bundle": bundle, "started_at_ms": self.started}
        if self.ordinal > 0:
            parent = self.links[-1]["bundle"]["policy"]["logical_request_sha256"]
            link["parent_request_sha256"] = parent
            link["repair_ordinal"] = self.ordinal
        self.links.append(link)

    def dispatch(self, dispatch: Callable[[Step], T]) -> Callable[[Step], T]:
        request, ordinal = self.request, self.ordinal

        def with_request(step: Step) -> T:
            step.request = request
            step.repair_ordinal = ordinal
            return dispatch(step)

        return with_request

    def repairable(self, stopped: RunStoppedError) -> None:
        """After a stopped run: raise it (carrying the chain) unless the core
        says a repair may follow its end (it stopped on invalid output), and
        keep that repair's key, its digest and its ordinal."""
        stopped.chain = self.document()
        tenant, operation = self.scope if self.scope is not None else (None, None)
        step: Optional[Dict[str, Any]] = json.loads(call(_core.repair_step, to_text(self.links), self.root_key, tenant, operation))
        if step is None:
            raise stopped
        self.step = step

    def failed(self, exc: BaseException) -> DecodeError:
        """``repair_function_failed`` for a repair function that raised or
        returned a request that cannot be canonicalized, carrying the chain."""
        error = DecodeError(
            "repair_function_failed",
            f"the repair function failed: {type(exc).__name__}: {exc}"
            if not isinstance(exc, RetryledgerError)
            else f"the repair function returned a request that cannot be canonicalized: {exc}",
            "/repair",
        )
        error.chain = self.document()  # type: ignore[attr-defined]
        return error

    def advance(self, stopped: RunStoppedError, request: Any) -> None:
        """The next repair's policy, key and request, or the reason there is
        none raised (the run's own error, with ``repair_refused``)."""
        try:
            digest = request_sha256(request)
        except RetryledgerError as exc:
            raise self.failed(exc) from exc
        step = self.step
        started = self.elapsed()
        try:
            policy = next_repair(self.links, digest, step["idempotency_key_sha256"], started)
        except DriftError as no:
            if no.code in _NO_REPAIR:
                stopped.repair_refused = no
                raise stopped from no
            raise
        self.policy = Policy(policy)
        self.key = str(step["idempotency_key"])
        self.request = request
        self.ordinal = int(step["repair_ordinal"])
        self.started = started


def run_repaired(
    policy: Any,
    dispatch: Callable[[Step], T],
    idempotency_key: str,
    *,
    repair: Repair,
    request: Any,
    checks: Optional[Sequence[Callable[[Any], Any]]],
    key_scope: Optional[Tuple[str, str]],
    clock: Optional[Callable[[], float]],
    sleep: Optional[Callable[[float], None]],
    **options: Any,
) -> RunResult[T]:
    from ._driver import run

    clock = clock or _monotonic_ms
    chain = _Chain(policy, idempotency_key, request, key_scope, clock)
    seen = _Seen()
    wrapped = [seen.wrap(c, i == 0) for i, c in enumerate(checks or ())]
    while True:
        try:
            result = run(
                chain.policy, chain.dispatch(dispatch), chain.key, checks=wrapped, key_scope=key_scope,
                clock=clock, sleep=sleep or _sleep_ms, **options,
            )
        except RunStoppedError as stopped:
            chain.add(stopped.bundle)
            chain.repairable(stopped)
            try:
                request = repair(seen.output, defects_of(seen.verdicts))
            except Exception as exc:
                raise chain.failed(exc) from exc
            chain.advance(stopped, request)
            continue
        chain.add(result.bundle)
        result.chain = chain.document()
        return result


async def run_repaired_async(
    policy: Any,
    dispatch: Callable[[Step], Awaitable[T]],
    idempotency_key: str,
    *,
    repair: Repair,
    request: Any,
    checks: Optional[Sequence[Callable[[Any], Any]]],
    key_scope: Optional[Tuple[str, str]],
    clock: Optional[Callable[[], float]],
    sleep: Optional[Callable[[float], Awaitable[None]]],
    **options: Any,
) -> RunResult[T]:
    from ._driver import run_async

    clock = clock or _monotonic_ms
    chain = _Chain(policy, idempotency_key, request, key_scope, clock)
    seen = _Seen()
    wrapped = [seen.wrap(c, i == 0) for i, c in enumerate(checks or ())]
    while True:
        try:
            result = await run_async(
                chain.policy, chain.dispatch(dispatch), chain.key, checks=wrapped, key_scope=key_scope,
                clock=clock, sleep=sleep or _async_sleep_ms, **options,
            )
        except RunStoppedError as stopped:
            chain.add(stopped.bundle)
            chain.repairable(stopped)
            try:
                request = repair(seen.output, defects_of(seen.verdicts))
                if inspect.isawaitable(request):  # an async repair function
                    request = await request
            except Exception as exc:
                raise chain.failed(exc) from exc
            chain.advance(stopped, request)
            continue
        chain.add(result.bundle)
        result.chain = chain.document()
        return result
