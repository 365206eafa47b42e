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
from typing import Any, Awaitable, Callable, Dict, Generator, Generic, List, Mapping, Optional, Tuple, TypeVar, Union

from . import _core
from ._api import Document, Policy
from ._driver import AttemptError, Classifier, Step, _async_sleep_ms, _checked, _schedule_for, _sleep_ms, _wall_ms, facts_of
from ._errors import DecodeError, RetryledgerError
from .journal import JournalWriter, journal_classify
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


class _Outcome:
    """The sealed end of a journaled run, shared by the result and the error:
    the core's sealed run, whose receipt digest and canonical bundle it
    computed once."""

    _sealed: _core.Sealed
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
        self, value: Optional[T], sealed: _core.Sealed, run_id: str, lease_generation: int, events: List[Dict[str, Any]]
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

    def __init__(self, sealed: _core.Sealed, run_id: str, lease_generation: int, events: List[Dict[str, Any]]) -> None:
        self._sealed = sealed
        self.run_id = run_id
        self.lease_generation = lease_generation
        self.events = events
        count = len(sealed.attempts["attempts"])
        RetryledgerError.__init__(
            self, self.terminal, f"run {run_id} ended with {self.terminal} after {count} attempt{'s' if count != 1 else ''}"
        )


class _Owner:
    """One owner of a run: its lease generation, the journal as read, and the
    durable append (lease check, append, refusal classified)."""

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
        #: The journal's writer: verified once, its replay kept between
        #: appends (each event is checked alone, not the journal again).
        self.writer = JournalWriter(policy, events, generation)
        self.on_append = on_append

    def recover(self, reconciliation: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        """What the owner does next (``journal_recover`` of the journal so far)."""
        return self.writer.recover(reconciliation)

    def session(self) -> _core.Session:
        """The core's session continuing the run the journal holds."""
        session = self.policy.session()
        if self.schedule is not None:
            session.set_price_schedule(self.schedule)
        self.writer.resume(session)
        return session

    def append(self, entry: Dict[str, Any]) -> Dict[str, Any]:
        text = self.writer.append_json(entry)
        event: Dict[str, Any] = json.loads(text)
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
        return event


def _read(store: Any, log: str) -> List[Dict[str, Any]]:
    events: List[Dict[str, Any]] = [json.loads(e.text) for e in store.read(log, 0)]
    return events


def _answer(given: Union[str, Mapping[str, Any]]) -> Tuple[str, Optional[int], Any]:
    """(answer, cost, value) of what ``reconcile`` returned."""
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
    return str(answer), cost, value


def _next(events: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What follows the journal's last event, when it is plain from that event
    alone (the core checks every event again as it builds it); ``None`` after
    ``dispatched`` (an attempt in doubt) and ``terminal``: ``journal_recover``
    answers those."""
    last = events[-1]
    kind = last["kind"]
    if kind in ("created", "observed"):
        return {"kind": "resume", "next": "decided"}
    if kind == "decided":
        return {"kind": "resume", "next": "reserved" if last["decision"]["kind"] == "dispatch" else "terminal"}
    if kind == "reserved":
        return {"kind": "resume", "next": "dispatched", "dispatch": last["dispatch"]}
    return None


#: What the loop asks its driver to do: wait ``ms`` (run clock), ask the
#: receiver (``reconcile``), or call ``dispatch``; the driver sends back
#: nothing, the answer, or ``(True, value)`` / ``(False, exception)``.
_Request = Tuple[str, Any]


def _loop(
    owner: _Owner,
    idempotency_key: str,
    reconciles: bool,
    classify: Optional[Classifier],
    clock: Callable[[], float],
    max_polls: int,
) -> Generator[_Request, Any, JournaledResult[Any]]:
    """The loop every entry point shares, sync or async: ask the core what the
    journal needs next and do exactly that, until the terminal is written.
    Waiting, asking the receiver and dispatching are yielded to the driver."""
    created = owner.events[0]["created_at_epoch_ms"]

    def now() -> int:
        return max(0, int(clock() - created))

    def wait_until(at_ms: int) -> Generator[_Request, Any, int]:
        t = now()
        while t < at_ms:
            yield ("sleep", at_ms - t)
            t = now()
        return t

    value: Any = None
    reconciliation: Optional[Dict[str, Any]] = None
    while True:
        step = _next(owner.events)
        if step is None:
            step = owner.recover(reconciliation)
        kind = step["kind"]
        if kind == "done":
            break
        if kind == "reconcile":
            if not reconciles:
                raise JournaledRunError(
                    "reconcile_missing",
                    "an attempt was dispatched without an observation: pass reconcile= to ask the receiver",
                    "/reconcile",
                )
            pending = dict(step["attempt"], idempotency_key=idempotency_key)
            at = yield from wait_until(int(step["not_before_ms"]))
            answer, cost, told = _answer((yield ("reconcile", pending)))
            if reconciliation is None:
                reconciliation = {
                    "schema": "retryledger.reconciliation.v1",
                    "ordinal": pending["ordinal"],
                    "max_polls": max_polls,
                    "answers": [],
                }
            given: Dict[str, Any] = {"answer": answer, "at_ms": at}
            if cost is not None and answer != "in_progress":
                given["cost"] = cost
            reconciliation["answers"].append(given)
            if answer == "succeeded":
                value = told
            continue
        if kind == "adopt":
            owner.append({"kind": "observed", "attempt": step["attempt"]})
            reconciliation = None
            continue
        nxt = step["next"]
        if nxt != "dispatched":
            owner.append({"kind": nxt})
            continue
        plan: Dict[str, Any] = step["dispatch"]
        started = yield from wait_until(int(plan["not_before_ms"]))
        owner.append({"kind": "dispatched", "started_at_ms": started})
        # The core's session, resumed from the journal: it plans this very
        # attempt, records usage and the request body, judges the facts and
        # builds the attempt the journal observes.
        session = owner.session()
        planned = session.next()
        # The journal verified with a reservation: the core plans it (never reached otherwise).
        assert isinstance(planned, _core.Dispatch), "the resumed journal has no planned dispatch"
        attempt_step = Step(planned, idempotency_key, started, owner.schedule, session)
        ok, returned = yield ("dispatch", attempt_step)
        if ok:
            facts = _core.Facts(result="returned")
        elif type(returned) is AttemptError:
            facts = returned._facts
        else:
            facts = facts_of(
                returned, classify=classify, output_delivered=attempt_step._delivered, now_unix_ms=max(0, int(clock()))
            )
        completed = max(now(), started)
        session.observe(started, completed, attempt_step._cost, facts)
        owner.append({"kind": "observed", "attempt": session.attempts["attempts"][-1]})
        if ok and session.terminal == "completed":
            value = returned
    sealed = owner.session().seal()
    if sealed.terminal != "completed":
        raise JournaledStopError(sealed, owner.run_id, owner.generation, list(owner.events))
    return JournaledResult(value, sealed, owner.run_id, owner.generation, list(owner.events))


def _drive(
    loop: Generator[_Request, Any, JournaledResult[Any]],
    dispatch: Callable[[JournalStep], Any],
    reconcile: Optional[Reconcile],
    sleep: Callable[[float], None],
) -> JournaledResult[Any]:
    """Run the loop, calling ``dispatch``, ``reconcile`` and ``sleep`` in this thread."""
    reply: Any = None
    while True:
        try:
            kind, arg = loop.send(reply)
        except StopIteration as done:
            result: JournaledResult[Any] = done.value
            return result
        if kind == "sleep":
            sleep(arg)
            reply = None
        elif kind == "reconcile":
            assert reconcile is not None
            reply = reconcile(arg)
        else:
            try:
                reply = (True, dispatch(arg))
            except Exception as exc:
                reply = (False, exc)


async def _drive_async(
    loop: Generator[_Request, Any, JournaledResult[Any]],
    dispatch: Callable[[JournalStep], Awaitable[Any]],
    reconcile: Optional[AsyncReconcile],
    sleep: Callable[[float], Awaitable[None]],
) -> JournaledResult[Any]:
    """Run the loop, awaiting ``dispatch``, ``reconcile`` (sync or async) and
    ``sleep``. A cancellation propagates at once: an attempt cancelled in
    flight stays in doubt in the journal, and ``resume`` reconciles it."""
    reply: Any = None
    while True:
        try:
            kind, arg = loop.send(reply)
        except StopIteration as done:
            result: JournaledResult[Any] = done.value
            return result
        if kind == "sleep":
            await sleep(arg)
            reply = None
        elif kind == "reconcile":
            assert reconcile is not None
            answer = reconcile(arg)
            reply = await answer if inspect.isawaitable(answer) else answer
        else:
            try:
                reply = (True, await dispatch(arg))
            except Exception as exc:
                reply = (False, exc)


def _store_of(store: object) -> Any:
    for method in ("get", "compare_and_set", "append", "read"):
        if not callable(getattr(store, method, None)):
            raise DecodeError(
                "invalid_type", "store= takes a register and append log (retryledger.stores)", "/store"
            )
    return store


def _compiled(policy: Union[Policy, Document], idempotency_key: str, key_scope: Optional[Tuple[str, str]]) -> Policy:
    compiled = _checked(policy, idempotency_key, key_scope)
    # The core says which policies a journal can carry (no fleet section, no
    # stream contract: their snapshots and event log are not in a journal),
    # before anything is claimed or written.
    compiled.session().resume_journal("[]")
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
) -> _Owner:
    """Claim a new run: its lease at generation 1 and an empty journal, then ``created``."""
    compiled = _compiled(policy, idempotency_key, key_scope)
    schedule = _schedule_for(compiled, price_schedule)
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
    owner = _Owner(compiled, store, run_id, log, lease, generation, [], on_append, schedule)
    _start(owner, clock)
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


def _start(owner: _Owner, clock: Callable[[], float]) -> None:
    """Start the run of an empty journal as the core says (``journal_recover``
    of no event: resume with ``created`` at seq 0): nothing was sent."""
    start = owner.recover(None)
    if start["kind"] != "resume" or start["next"] != "created":
        raise RunNotFoundError(f"the journal {owner.log} holds no event and the core does not start it")
    owner.append({"kind": "created", "run_id": owner.run_id, "created_at_epoch_ms": max(0, int(clock()))})


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
) -> _Owner:
    """Take a run over: the lease raised by compare-and-set, the journal read
    and verified. A run claimed but never created (its owner died between the
    claim and ``created``: nothing was sent) is started from the beginning."""
    compiled = _compiled(policy, idempotency_key, key_scope)
    schedule = _schedule_for(compiled, price_schedule)
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
    owner = _Owner(compiled, store, run_id, log, lease, generation, events, on_append, schedule)
    if not events:
        _start(owner, clock)
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
    in :func:`retryledger.run`; a resumed run must be given the same one."""
    clock = _wall_ms if clock is None else clock
    owner = _open(policy, idempotency_key, store, run_id, clock, on_append, key_scope, max_polls, log, lease, price_schedule)
    loop = _loop(owner, idempotency_key, reconcile is not None, classify, clock, max_polls)
    return _drive(loop, dispatch, reconcile, _sleep_ms if sleep is None else sleep)


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
    owner = _take_over(policy, idempotency_key, store, run_id, clock, on_append, key_scope, max_polls, log, lease, price_schedule)
    loop = _loop(owner, idempotency_key, reconcile is not None, classify, clock, max_polls)
    return _drive(loop, dispatch, reconcile, _sleep_ms if sleep is None else sleep)


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
) -> JournaledResult[T]:
    """:func:`run_journaled` for coroutines: ``dispatch`` and ``sleep`` (ms)
    are awaited, ``reconcile`` may be either. The store's appends are made
    from the event loop's thread, each one durable before the next step (a
    local SQLite or PostgreSQL commit). Cancelling the task while an attempt
    is in flight leaves it in doubt in the journal, as a crash would:
    :func:`resume_async` reconciles it."""
    clock = _wall_ms if clock is None else clock
    owner = _open(policy, idempotency_key, store, run_id, clock, on_append, key_scope, max_polls, log, lease, price_schedule)
    loop = _loop(owner, idempotency_key, reconcile is not None, classify, clock, max_polls)
    return await _drive_async(loop, dispatch, reconcile, _async_sleep_ms if sleep is None else sleep)


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
) -> JournaledResult[T]:
    """:func:`resume` for coroutines (see :func:`run_journaled_async`)."""
    clock = _wall_ms if clock is None else clock
    owner = _take_over(policy, idempotency_key, store, run_id, clock, on_append, key_scope, max_polls, log, lease, price_schedule)
    loop = _loop(owner, idempotency_key, reconcile is not None, classify, clock, max_polls)
    return await _drive_async(loop, dispatch, reconcile, _async_sleep_ms if sleep is None else sleep)
