"""Journal-backed runs: a run whose every step is an event of its journal in a
store's append log, so that a new process can take it over after a crash
(docs/JOURNAL.md, "Running with a journal").

:func:`run_journaled` opens a run: it claims the run's lease (generation 1),
appends ``created`` and ``decided``, then for every attempt ``reserved`` and
``dispatched`` -- the latter awaited in the store *before* ``dispatch`` is
called -- then ``observed`` and ``decided``, and ``terminal`` with the
receipt's digest. :func:`resume` is what a new owner calls: it raises the
lease generation by compare-and-set, reads and verifies the journal, and asks
the core what to do (``journal_recover``). An attempt dispatched without an
observation is never sent again blind: the new owner calls ``reconcile``,
which asks the receiver by idempotency key, on the core's bounded poll
schedule, and only ``failed_no_effect`` lets the plan dispatch again.

Every step is decided by the core from the journal alone (one loop serves
every entry point; :func:`run_journaled_async` and :func:`resume_async` await
``dispatch``, ``sleep`` and ``reconcile`` where the others call them), so a resumed run ends in the same bundle shape as the
plain driver: ``policy``, ``attempts`` and ``receipt``.

Ownership is a register, ``lease/<run_id>`` by default, whose store
generation *is* the lease generation (every write raises it by one). Every
append is fenced by it: the stores of this package check the register in the
append's own transaction (``append_fenced``; a store without it is read
first). When the generation moved, the run was taken over and the owner
stops with :class:`LeaseLostError` (code ``lease_lost``) without writing. An append whose ``seq`` is taken stops the
same way, with the core's classification of the refused event
(``journal_classify``: ``evidence``, ``stale_lease`` or ``seq_taken``) as
``evidence``; nothing in the journal is ever overwritten.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Awaitable, Callable, Dict, Generic, List, Mapping, Optional, Tuple, TypeVar, Union

from . import _core
from ._api import Document, Policy
from ._driver import (
    AttemptCallback,
    Classifier,
    DecisionCallback,
    MachineStep,
    SleepCallback,
    Step,
    TerminalCallback,
    _async_sleep_ms,
    _checked,
    _fleet_for,
    _schedule_for,
    _sleep_ms,
    _wall_ms,
)
from ._errors import DecodeError, RetryledgerError
from ._loop import LoopResult, Machine, pump, pump_async, run_loop
from .fleet import Fleet
from .journal import journal_classify
from .machine import FleetAdapter, fleet_options
from .stores import LEASE_LOST, Log, Store

__all__ = [
    "JournalStep",
    "JournaledResult",
    "JournaledStopError",
    "JournaledRunError",
    "LeaseLostError",
    "RunExistsError",
    "RunNotFoundError",
    "Reconcile",
    "run_journaled",
    "resume",
    "run_journaled_async",
    "resume_async",
    "journal_log",
    "lease_key",
]

T = TypeVar("T")

#: The answers a ``reconcile`` function may give.
ANSWERS = ("succeeded", "failed_no_effect", "in_progress", "unknown")

#: ``reconcile(attempt)``: the pending attempt as ``journal_recover`` gives it
#: (``ordinal``, ``route_id``, ``started_at_ms``, ``idempotency_key_sha256``,
#: ``route_release_sha256``, and ``idempotency_key``, the raw key) -> one of
#: :data:`ANSWERS`, or a mapping ``{"answer": ..., "cost"?: int, "value"?: ...}``
#: (``value``: what the receiver holds for a ``succeeded`` attempt, returned as
#: the run's value).
Reconcile = Callable[[Dict[str, Any]], Union[str, Mapping[str, Any]]]

#: ``reconcile`` of the async entry points: a plain function or a coroutine function.
AsyncReconcile = Callable[[Dict[str, Any]], Union[str, Mapping[str, Any], Awaitable[Union[str, Mapping[str, Any]]]]]

#: Called after every event the run appended durably (the event as a dict).
AppendCallback = Callable[[Dict[str, Any]], None]


def journal_log(run_id: str) -> str:
    """The default log name of a run's journal."""
    return f"journal/{run_id}"


def lease_key(run_id: str) -> str:
    """The default register key of a run's lease."""
    return f"lease/{run_id}"


class JournaledRunError(RetryledgerError):
    """A journaled run cannot go on as asked; ``code`` says why: ``lease_lost``,
    ``run_exists``, ``run_not_found`` or ``reconcile_missing`` (an attempt waits
    for reconciliation and no ``reconcile`` was given). These codes are the
    host's, the same in both packages; the journal's own are
    :class:`~retryledger.JournalError`'s."""


class LeaseLostError(JournaledRunError):
    """Another owner took the run over (code ``lease_lost``): the lease register
    moved past this owner's generation, or another event holds the ``seq`` this
    owner was about to append. Nothing was written; ``evidence`` is the core's
    classification of the refused event (``journal_classify``) when the store
    refused it, ``None`` when the lease check stopped it first."""

    def __init__(
        self,
        message: str,
        *,
        seq: int,
        lease_generation: int,
        evidence: Optional[Dict[str, Any]] = None,
        event: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__("lease_lost", message, "/lease_generation")
        #: The event this owner was about to append (``None`` when it lost the takeover itself).
        self.event = event
        self.seq = seq
        self.lease_generation = lease_generation
        self.evidence = evidence


class RunExistsError(JournaledRunError):
    """``run_journaled`` on a run whose lease or journal already exists (code
    ``run_exists``): take it over with :func:`resume` instead."""

    def __init__(self, message: str) -> None:
        super().__init__("run_exists", message, "/run_id")


class RunNotFoundError(JournaledRunError):
    """``resume`` of a run with neither a lease nor a journal event (code ``run_not_found``)."""

    def __init__(self, message: str) -> None:
        super().__init__("run_not_found", message, "/run_id")


#: What ``dispatch`` receives in a journaled run: the same :class:`Step` as
#: the plain driver (the planned dispatch, the raw key, charge, usage, the
#: request body), backed by the core's session resumed from the journal.
JournalStep = Step


class _MachineSealed:
    """The sealed run as the host loop gives it, with the shape of the core's
    sealed run the results read."""

    def __init__(self, result: LoopResult) -> None:
        self._result = result

    @property
    def bundle(self) -> Dict[str, Any]:
        return self._result.bundle

    @property
    def terminal(self) -> str:
        return self._result.terminal

    @property
    def receipt(self) -> Dict[str, Any]:
        return self._result.receipt

    @property
    def receipt_sha256(self) -> str:
        return self._result.receipt_sha256

    @property
    def bundle_json(self) -> str:
        return self._result.bundle_json

    @property
    def attempts(self) -> Dict[str, Any]:
        attempts: Dict[str, Any] = self._result.bundle["attempts"]
        return attempts


class _Outcome:
    """The sealed end of a journaled run, shared by the result and the error:
    the sealed run, whose receipt digest and canonical bundle the core
    computed once."""

    _sealed: _MachineSealed
    run_id: str
    lease_generation: int
    events: List[Dict[str, Any]]

    @property
    def bundle(self) -> Dict[str, Any]:
        """The bundle as a plain dict: policy, attempts and receipt."""
        return self._sealed.bundle

    @property
    def terminal(self) -> str:
        """How the run ended (``completed``, ``stop_route_exhausted``, ...)."""
        return str(self._sealed.terminal)

    @property
    def receipt(self) -> Dict[str, Any]:
        """The receipt as a plain dict."""
        return self._sealed.receipt

    @property
    def receipt_sha256(self) -> str:
        """The receipt's digest (the ``terminal`` event's ``receipt_sha256``)."""
        return self._sealed.receipt_sha256

    @property
    def bundle_json(self) -> str:
        """The bundle as canonical JSON (what ``python -m retryledger verify`` reads)."""
        return self._sealed.bundle_json

    @property
    def reconciled(self) -> List[int]:
        """The ordinals of the attempts whose outcome came from the receiver."""
        return [a["ordinal"] for a in self._sealed.attempts["attempts"] if "reconciled" in a]


class JournaledResult(_Outcome, Generic[T]):
    """A completed journaled run: ``value`` (what ``dispatch`` returned on the
    successful attempt, or what ``reconcile`` said the receiver holds for an
    adopted one, else ``None``), the ``bundle`` and its receipt, and the
    journal's ``events``."""

    def __init__(
        self, value: Optional[T], sealed: _MachineSealed, run_id: str, lease_generation: int, events: List[Dict[str, Any]]
    ) -> None:
        self.value = value
        self._sealed = sealed
        self.run_id = run_id
        self.lease_generation = lease_generation
        self.events = events

    def __repr__(self) -> str:
        return f"JournaledResult(terminal={self.terminal!r}, receipt_sha256={self.receipt_sha256!r})"


class JournaledStopError(_Outcome, RetryledgerError):
    """A journaled run ended without success; ``code`` is its terminal."""

    def __init__(self, sealed: _MachineSealed, run_id: str, lease_generation: int, events: List[Dict[str, Any]]) -> None:
        self._sealed = sealed
        self.run_id = run_id
        self.lease_generation = lease_generation
        self.events = events
        count = len(sealed.attempts["attempts"])
        RetryledgerError.__init__(
            self, self.terminal, f"run {run_id} ended with {self.terminal} after {count} attempt{'s' if count != 1 else ''}"
        )


#: A journaled run's hooks: ``on_decision``, ``on_sleep``, ``on_attempt``, ``on_terminal``.
Hooks = Tuple[Optional[DecisionCallback], Optional[SleepCallback], Optional[AttemptCallback], Optional[TerminalCallback]]


class _Owner(FleetAdapter):
    """One owner of a run, as the host loop's adapter: its lease generation,
    the journal as read, the durable append (lease check, append, refusal
    classified), the run clock on the journal's origin, the caller's
    dispatch, sleep and reconcile, the fleet store and the hooks."""

    def __init__(
        self,
        policy: Policy,
        store: Any,
        run_id: str,
        log: str,
        lease: str,
        generation: int,
        events: List[Dict[str, Any]],
        on_append: Optional[AppendCallback],
        schedule: Optional[str] = None,
    ) -> None:
        self.policy = policy
        #: The run's price schedule as JSON text, checked against the policy.
        self.schedule = schedule
        self.store = store
        self.run_id = run_id
        self.log = log
        self.lease = lease
        self.generation = generation
        self.events = events
        self.on_append = on_append
        self.origin = 0
        self.clock: Callable[[], float] = _wall_ms
        self.idempotency_key = ""
        self.classify: Optional[Classifier] = None
        self.calls: Any = None
        self.answers: Any = None
        self.pause: Any = None
        self.options: Dict[str, Any] = {}

    def machine(self, clock: Callable[[], float], max_polls: int) -> Machine:
        """The run machine of this owner: started on an empty journal (the
        origin of its run clock is now), else resumed from the journal."""
        options: Dict[str, Any] = {
            "journal": {"run_id": self.run_id, "lease_generation": self.generation},
            "max_polls": max_polls,
            **fleet_options(self.fleet),
        }
        if self.schedule is not None:
            options["price_schedule"] = json.loads(self.schedule)
        self.clock = clock
        if not self.events:
            self.origin = max(0, int(clock()))
            options["origin_epoch_ms"] = self.origin
            return Machine.start(self.policy, options)
        # The run clock's origin is the journal's; a journal without one is
        # refused by the core's verification below.
        first = self.events[0]
        origin = first.get("created_at_epoch_ms") if isinstance(first, dict) else None
        self.origin = origin if isinstance(origin, int) and not isinstance(origin, bool) and origin >= 0 else 0
        options["origin_epoch_ms"] = self.origin
        options["now_ms"] = self.now_ms()
        return Machine.resume(self.policy, options, self.events)

    def now_ms(self) -> int:
        return max(0, int(self.clock() - self.origin))

    def sleep(self, ms: int) -> Any:
        return self.pause(ms)

    def dispatch(self, effect: Dict[str, Any]) -> Any:
        self.step = MachineStep(effect, self.idempotency_key, self.schedule)
        return self.calls(self.step)

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        return self.step.observation(ok, reply, self.classify, max(0, int(self.clock())))

    def reconcile(self, attempt: Dict[str, Any], poll: int) -> Any:
        if self.answers is None:
            raise JournaledRunError(
                "reconcile_missing",
                "an attempt was dispatched without an observation: pass reconcile= to ask the receiver",
                "/reconcile",
            )
        given = self.answers(dict(attempt, idempotency_key=self.idempotency_key))
        if inspect.isawaitable(given):

            async def answered() -> Dict[str, Any]:
                return _answer(await given)

            return answered()
        return _answer(given)

    def append(self, events: List[Dict[str, Any]]) -> bool:
        for event in events:
            self._append(event)
        return True

    def _append(self, event: Dict[str, Any]) -> None:
        text = json.dumps(event, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        seq = int(event["seq"])
        fenced = getattr(self.store, "append_fenced", None)
        if fenced is not None:
            # The lease is checked in the append's own transaction.
            answer = fenced(self.log, seq, text, self.lease, self.generation)
        else:
            # A store without it: the lease read, then the append (a late
            # owner may still slip one event in between; docs/JOURNAL.md).
            _, current = self.store.get(self.lease)
            answer = LEASE_LOST if current != self.generation else self.store.append(self.log, seq, text)
        if answer.code == "lease_lost":
            raise LeaseLostError(
                f"the lease of {self.run_id} has moved past generation {self.generation}",
                seq=seq,
                lease_generation=self.generation,
                event=event,
            )
        if not answer.ok:
            held = _read(self.store, self.log)
            evidence = journal_classify(self.policy, held, event)
            raise LeaseLostError(
                f"seq {seq} of {self.run_id} is taken by another owner's event",
                seq=seq,
                lease_generation=self.generation,
                evidence=evidence,
                event=event,
            )
        self.events.append(event)
        if self.on_append is not None:
            self.on_append(event)


def _read(store: Any, log: str) -> List[Dict[str, Any]]:
    events: List[Dict[str, Any]] = [json.loads(e.text) for e in store.read(log, 0)]
    return events


def _answer(given: Union[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """The receiver's answer as the host loop takes it, from what ``reconcile`` returned."""
    answer: Any
    cost: Any
    value: Any
    if isinstance(given, str):
        answer, cost, value = given, None, None
    elif isinstance(given, Mapping):
        answer, cost, value = given.get("answer"), given.get("cost"), given.get("value")
    else:
        raise DecodeError("invalid_type", "reconcile answers a string or a mapping with `answer`", "/answer")
    if answer not in ANSWERS:
        raise DecodeError("invalid_value", f"reconcile answers one of {', '.join(ANSWERS)}, got {answer!r}", "/answer")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int) or cost < 0):
        raise DecodeError("invalid_value", "a reconciled cost is a non-negative integer", "/cost")
    out: Dict[str, Any] = {"answer": str(answer), "value": value}
    if cost is not None and answer != "in_progress":
        out["cost"] = cost
    return out


def _prepared(
    owner: _Owner,
    idempotency_key: str,
    dispatch: Any,
    reconcile: Any,
    classify: Optional[Classifier],
    clock: Callable[[], float],
    sleep: Any,
    max_polls: int,
    hooks: Hooks,
) -> Tuple[Machine, _Owner]:
    owner.idempotency_key = idempotency_key
    owner.calls = dispatch
    owner.answers = reconcile
    owner.classify = classify
    owner.pause = sleep
    owner.hooks = hooks
    return owner.machine(clock, max_polls), owner


def _ended(owner: _Owner, result: LoopResult) -> JournaledResult[Any]:
    sealed = _MachineSealed(result)
    if result.terminal != "completed":
        raise JournaledStopError(sealed, owner.run_id, owner.generation, list(owner.events))
    return JournaledResult(result.value, sealed, owner.run_id, owner.generation, list(owner.events))


def _store_of(store: object) -> Any:
    for method in ("get", "compare_and_set", "append", "read"):
        if not callable(getattr(store, method, None)):
            raise DecodeError(
                "invalid_type", "store= takes a register and append log (retryledger.stores)", "/store"
            )
    return store


def _compiled(policy: Union[Policy, Document], idempotency_key: str, key_scope: Optional[Tuple[str, str]]) -> Policy:
    compiled = _checked(policy, idempotency_key, key_scope)
    # What this driver carries is the core's to say, before anything is claimed.
    compiled._compiled.require_driver("journaled")
    return compiled


def _check_polls(max_polls: object) -> None:
    if isinstance(max_polls, bool) or not isinstance(max_polls, int) or not 1 <= max_polls <= 100:
        raise DecodeError("invalid_value", "max_polls is an integer in 1..=100", "/max_polls")


def _open(
    policy: Union[Policy, Document],
    idempotency_key: str,
    store: Any,
    run_id: str,
    clock: Callable[[], float],
    on_append: Optional[AppendCallback],
    key_scope: Optional[Tuple[str, str]],
    max_polls: int,
    log: Optional[str],
    lease: Optional[str],
    price_schedule: Optional[Document],
    fleet: Optional[Fleet],
) -> _Owner:
    """Claim a new run: its lease at generation 1 and an empty journal, then ``created``."""
    compiled = _compiled(policy, idempotency_key, key_scope)
    schedule = _schedule_for(compiled, price_schedule)
    used = _fleet_for(compiled, fleet)
    store = _store_of(store)
    log = journal_log(run_id) if log is None else log
    lease = lease_key(run_id) if lease is None else lease
    _check_polls(max_polls)
    generation = 1
    ok, current = store.compare_and_set(lease, 0, {"run_id": run_id, "lease_generation": generation})
    if not ok:
        # Claimed before. An owner that died after its claim and before
        # `created` sent nothing: its run is taken over and started here.
        if store.read(log, 0):
            raise RunExistsError(f"the journal {log} already holds events: resume() takes a run over")
        generation = _raise_lease(store, run_id, lease, current)
    if store.read(log, 0):
        raise RunExistsError(f"the journal {log} already holds events: resume() takes a run over")
    # The run machine opens the journal (`created` and `decided`).
    owner = _Owner(compiled, store, run_id, log, lease, generation, [], on_append, schedule)
    owner.use_fleet(used)
    return owner


def _raise_lease(store: Any, run_id: str, lease: str, current: int) -> int:
    """The lease taken over by compare-and-set from generation ``current``: the new generation."""
    generation = current + 1
    ok, now_at = store.compare_and_set(lease, current, {"run_id": run_id, "lease_generation": generation})
    if not ok:
        raise LeaseLostError(
            f"another owner took {run_id} over first (lease generation {now_at})", seq=0, lease_generation=generation
        )
    return generation


def _take_over(
    policy: Union[Policy, Document],
    idempotency_key: str,
    store: Any,
    run_id: str,
    clock: Callable[[], float],
    on_append: Optional[AppendCallback],
    key_scope: Optional[Tuple[str, str]],
    max_polls: int,
    log: Optional[str],
    lease: Optional[str],
    price_schedule: Optional[Document],
    fleet: Optional[Fleet],
) -> _Owner:
    """Take a run over: the lease raised by compare-and-set, the journal read
    and verified. A run claimed but never created (its owner died between the
    claim and ``created``: nothing was sent) is started from the beginning."""
    compiled = _compiled(policy, idempotency_key, key_scope)
    schedule = _schedule_for(compiled, price_schedule)
    used = _fleet_for(compiled, fleet)
    store = _store_of(store)
    log = journal_log(run_id) if log is None else log
    lease = lease_key(run_id) if lease is None else lease
    _check_polls(max_polls)
    _, current = store.get(lease)
    if current == 0 and not store.read(log, 0):
        # Neither claimed nor journaled: nothing to take over (and no lease written).
        raise RunNotFoundError(f"the run {run_id} has neither a lease nor a journal")
    generation = _raise_lease(store, run_id, lease, current)
    events = _read(store, log)
    # The owner's writer verifies the journal before anything is written.
    # The run machine verifies the journal before anything is written, and
    # starts the run of an empty one.
    owner = _Owner(compiled, store, run_id, log, lease, generation, events, on_append, schedule)
    owner.use_fleet(used)
    return owner


def run_journaled(
    policy: Union[Policy, Document],
    dispatch: Callable[[JournalStep], T],
    idempotency_key: str,
    *,
    store: Union[Store, Log, Any],
    run_id: str,
    reconcile: Optional[Reconcile] = None,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
    on_append: Optional[AppendCallback] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    max_polls: int = 5,
    log: Optional[str] = None,
    lease: Optional[str] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> JournaledResult[T]:
    """Run one logical request with its journal in ``store``: the value and
    sealed run, or :class:`JournaledStopError`.

    ``clock`` is the wall clock in Unix ms (default ``time.time() * 1000``):
    the journal's ``created`` event holds the run clock's origin on it, so a
    new owner reads the same run clock. ``sleep`` takes ms. ``on_append`` is
    called after every durable append. The lease register (``lease``, default
    ``lease/<run_id>``) must be absent and the log (``log``, default
    ``journal/<run_id>``) empty: :class:`RunExistsError` otherwise, except a
    lease whose journal is empty (its owner died between the claim and
    ``created``; nothing was sent): that run is taken over (the lease
    generation raised) and started here.
    ``price_schedule`` prices the usage a step reports (``step.usage``), as
    in :func:`retryledger.run`; a resumed run must be given the same one.
    ``fleet`` (a :class:`retryledger.Fleet`, required by a policy with a
    fleet section) admits every attempt as the plain driver does: the
    journal holds each attempt's admission, and a resumed run admits again
    under the fleet it is given (the same tenant under tenant shares). The
    hooks ``on_decision``, ``on_sleep``, ``on_attempt`` and ``on_terminal``
    are the plain driver's (docs/HOST_LOOP.md)."""
    clock = _wall_ms if clock is None else clock
    owner = _open(policy, idempotency_key, store, run_id, clock, on_append, key_scope, max_polls, log, lease, price_schedule, fleet)
    machine, adapter = _prepared(owner, idempotency_key, dispatch, reconcile, classify, clock, _sleep_ms if sleep is None else sleep, max_polls, (on_decision, on_sleep, on_attempt, on_terminal))
    return _ended(owner, pump(run_loop(machine, adapter), adapter))


def resume(
    policy: Union[Policy, Document],
    dispatch: Callable[[JournalStep], T],
    idempotency_key: str,
    *,
    store: Union[Store, Log, Any],
    run_id: str,
    reconcile: Optional[Reconcile] = None,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
    on_append: Optional[AppendCallback] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    max_polls: int = 5,
    log: Optional[str] = None,
    lease: Optional[str] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> JournaledResult[T]:
    """Take a run over and finish it: raise the lease generation by
    compare-and-set, read and verify the journal (the core refuses an
    unverified one with its coded :class:`~retryledger.JournalError`), then
    continue as the core says. An attempt dispatched without an observation
    is reconciled through ``reconcile`` (required then), never resent blind.
    A finished run is sealed again from its journal, nothing appended. A run
    whose lease exists but whose journal is empty (its owner died between
    the claim and ``created``: nothing was sent) is started from the
    beginning, as the core's recovery of an empty journal says. A run with
    neither a lease nor a journal is :class:`RunNotFoundError`, nothing
    written."""
    clock = _wall_ms if clock is None else clock
    owner = _take_over(policy, idempotency_key, store, run_id, clock, on_append, key_scope, max_polls, log, lease, price_schedule, fleet)
    machine, adapter = _prepared(owner, idempotency_key, dispatch, reconcile, classify, clock, _sleep_ms if sleep is None else sleep, max_polls, (on_decision, on_sleep, on_attempt, on_terminal))
    return _ended(owner, pump(run_loop(machine, adapter), adapter))


async def run_journaled_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[JournalStep], Awaitable[T]],
    idempotency_key: str,
    *,
    store: Union[Store, Log, Any],
    run_id: str,
    reconcile: Optional[AsyncReconcile] = None,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    on_append: Optional[AppendCallback] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    max_polls: int = 5,
    log: Optional[str] = None,
    lease: Optional[str] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> JournaledResult[T]:
    """:func:`run_journaled` for coroutines: ``dispatch`` and ``sleep`` (ms)
    are awaited, ``reconcile`` may be either. The store's appends are made
    from the event loop's thread, each one durable before the next step (a
    local SQLite or PostgreSQL commit). Cancelling the task while an attempt
    is in flight leaves it in doubt in the journal, as a crash would:
    :func:`resume_async` reconciles it."""
    clock = _wall_ms if clock is None else clock
    owner = _open(policy, idempotency_key, store, run_id, clock, on_append, key_scope, max_polls, log, lease, price_schedule, fleet)
    pause = _async_sleep_ms if sleep is None else sleep
    machine, adapter = _prepared(owner, idempotency_key, dispatch, reconcile, classify, clock, pause, max_polls, (on_decision, on_sleep, on_attempt, on_terminal))
    return _ended(owner, await pump_async(run_loop(machine, adapter), adapter))


async def resume_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[JournalStep], Awaitable[T]],
    idempotency_key: str,
    *,
    store: Union[Store, Log, Any],
    run_id: str,
    reconcile: Optional[AsyncReconcile] = None,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    on_append: Optional[AppendCallback] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    max_polls: int = 5,
    log: Optional[str] = None,
    lease: Optional[str] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> JournaledResult[T]:
    """:func:`resume` for coroutines (see :func:`run_journaled_async`)."""
    clock = _wall_ms if clock is None else clock
    owner = _take_over(policy, idempotency_key, store, run_id, clock, on_append, key_scope, max_polls, log, lease, price_schedule, fleet)
    pause = _async_sleep_ms if sleep is None else sleep
    machine, adapter = _prepared(owner, idempotency_key, dispatch, reconcile, classify, clock, pause, max_polls, (on_decision, on_sleep, on_attempt, on_terminal))
    return _ended(owner, await pump_async(run_loop(machine, adapter), adapter))
