"""The host loop: one generator over the core's run machine, and its two
pumps (:func:`pump` and :func:`pump_async`).

The machine (docs/COMPOSITION.md) says what to do next as an effect; the
generator turns each effect into one request to its :class:`Adapter`
(``dispatch``, ``sleep``, ``read``, ``write``, ``append``, ``reconcile``),
yields it to the pump, and answers the machine with the event the reply
makes. The generator decides nothing: it moves facts and time. A driver is
an adapter (what it dispatches, how it sleeps, which store and journal it
writes to) and the result shape it returns; every driver that runs on the
machine goes through this loop (docs/HOST_LOOP.md).

Every effect is handled in :func:`_effects` alone, so a new effect of the
machine is a new branch there and a new adapter method; an effect of a kind
this loop does not know is the coded error ``invalid_value`` at ``/kind``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from typing import Any, AsyncGenerator, Dict, Generator, List, Mapping, NamedTuple, Optional, Tuple, Union

from . import _core
from ._api import call
from ._errors import DecodeError
from .stores import StoreUnavailableError

__all__ = [
    "Adapter",
    "Answer",
    "LoopResult",
    "Machine",
    "run_loop",
    "pump",
    "pump_async",
    "pump_items",
    "pump_items_async",
    "store_read",
    "store_write",
]


class Machine:
    """A run of the core's machine: :meth:`next` is the outstanding effect,
    :meth:`answer` answers it with an event and gives the next one, and
    :meth:`seal` is the finished run's bundle. Effects and events are plain
    dicts tagged by ``kind`` (docs/COMPOSITION.md); a refused event raises
    the core's coded error and leaves the same effect outstanding."""

    __slots__ = ("_m",)

    def __init__(self, machine: _core.Machine) -> None:
        self._m = machine

    @classmethod
    def start(cls, policy: Any, options: Union[str, Mapping[str, Any]]) -> "Machine":
        """A run of ``policy`` (a document, its JSON text or a compiled policy) under ``options`` (or their JSON text)."""
        text = options if isinstance(options, str) else json.dumps(dict(options))
        return cls(call(_core.Machine.start, _policy_text(policy), text))

    @classmethod
    def resume(cls, policy: Any, options: Mapping[str, Any], journal: List[Dict[str, Any]]) -> "Machine":
        """The run ``journal`` holds, taken over as the owner ``options["journal"]`` names."""
        return cls(call(_core.Machine.resume, _policy_text(policy), json.dumps(dict(options)), json.dumps(journal)))

    def next(self) -> Dict[str, Any]:
        """The outstanding effect."""
        effect: Dict[str, Any] = json.loads(self._m.next())
        return effect

    def answer(self, event: Mapping[str, Any]) -> Dict[str, Any]:
        """Answer the outstanding effect: the next effect."""
        effect: Dict[str, Any] = json.loads(call(self._m.answer, json.dumps(dict(event))))
        return effect

    def observed(self) -> Optional[Dict[str, Any]]:
        """The last attempt recorded and its judgement (``attempt``, ``judgement``)."""
        text = self._m.observed()
        return None if text is None else dict(json.loads(text))

    def planned(self) -> Optional[Dict[str, Any]]:
        """The attempt the machine plans next (its dispatch), when one is: what a wait is for."""
        text = self._m.planned()
        return None if text is None else dict(json.loads(text))

    @property
    def now_ms(self) -> int:
        """The run clock as the machine last read it, ms."""
        return self._m.now_ms

    def seal(self) -> Dict[str, Any]:
        """The finished run's bundle."""
        bundle: Dict[str, Any] = json.loads(call(self._m.seal))
        return bundle

    def sealed(self) -> Tuple[Dict[str, Any], str, str]:
        """The finished run's bundle, its receipt's digest and the bundle's canonical JSON."""
        text = call(self._m.sealed)
        # `{"bundle":<bundle>,"receipt_sha256":"<64 hex>"}`, canonical.
        bundle_json = text[len('{"bundle":') : -len(',"receipt_sha256":"') - 64 - 2]
        both = json.loads(text)
        return both["bundle"], str(both["receipt_sha256"]), bundle_json


def _policy_text(policy: Any) -> Any:
    """A policy as the extension takes it: compiled once (a ``Policy``), or JSON text."""
    if isinstance(policy, str):
        return policy
    compiled = getattr(policy, "_compiled", None)
    if isinstance(compiled, _core.Compiled):
        return compiled
    return json.dumps(policy)


class LoopResult(NamedTuple):
    """What one run through the loop gives every driver: the value of the
    attempt that completed it (or what the receiver held for an adopted
    one), the receipt and its digest, and the bundle."""

    value: Any
    receipt: Dict[str, Any]
    receipt_sha256: str
    bundle: Dict[str, Any]
    #: The bundle's canonical JSON (what ``python -m retryledger verify`` reads).
    bundle_json: str

    @property
    def terminal(self) -> str:
        """How the run ended."""
        return str(self.receipt["terminal"])


class Adapter:
    """What a driver supplies: the I/O of each effect, the run clock and the
    hooks. Every method may be a coroutine function under :func:`pump_async`.
    The defaults refuse what the driver did not set up, so an effect a driver
    cannot carry out is a coded error, never a silent skip."""

    #: The namespace the fleet store's keys go under (``<namespace>/breaker/...``).
    namespace: str = "retryledger"
    #: The run's result once a pump of items ended it (:func:`pump_items`).
    result: Optional[LoopResult] = None
    #: Announce each planned attempt (``on_decision``) before its wait and
    #: admission, not at its send.
    announces_plans: bool = False

    def now_ms(self) -> int:
        """The run clock, ms (never lower than a reading before it)."""
        raise NotImplementedError

    def cancelled(self) -> bool:
        """Whether the caller cancelled the run (checked before each wait)."""
        return False

    def cancel(self) -> None:
        """The caller cancelled the run's task (:func:`pump_async` with
        ``cancellable``): from now on :meth:`cancelled` says so."""
        raise asyncio.CancelledError()

    def cancelled_before_send(self) -> bool:
        """Whether the caller cancelled before the attempt planned now is
        sent (a run without a journal: the machine then cancels the run,
        nothing sent)."""
        return False

    def dispatch(self, effect: Dict[str, Any]) -> Any:
        """Send the attempt ``effect["dispatch"]``: its value, or raise."""
        raise NotImplementedError

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        """The plain facts of what the attempt returned (``ok``) or raised: the
        ``observed`` event's fields but its ``kind`` and ``completed_at_ms``
        (``facts``, ``cost``, ``usage``, ``request_body_sha256``,
        ``used_tokens``, ``deltas``)."""
        raise NotImplementedError

    def sleep(self, ms: int) -> Any:
        """Wait ``ms`` milliseconds of the run clock."""
        raise NotImplementedError

    def cancel_attempt(self, ordinal: int) -> None:
        """A hedged run: attempt ``ordinal`` lost its round and is cancelled
        (under :func:`pump_async` its task is cancelled already)."""

    def read(self, keys: List[str]) -> List[Dict[str, Any]]:
        """One row ``{"document"?, "generation"}`` per key; raise
        :class:`~retryledger.stores.StoreUnavailableError` when the store
        cannot be reached."""
        raise _missing("read", "/fleet", "the policy has a fleet section: pass a fleet store")

    def write(self, writes: List[Dict[str, Any]]) -> int:
        """Compare-and-set each write in order, stopping at the first refused: how many were written."""
        raise _missing("write", "/fleet", "the policy has a fleet section: pass a fleet store")

    def append(self, events: List[Dict[str, Any]]) -> bool:
        """Make the journal events durable (all, in order): ``False`` when the store refused them."""
        raise _missing("append", "/journal", "the run is journaled: pass a journal store")

    def reconcile(self, attempt: Dict[str, Any], poll: int) -> Mapping[str, Any]:
        """Ask the receiver about an attempt in doubt: ``{"answer", "cost"?, "value"?}``."""
        raise _missing("reconcile", "/reconcile", "an attempt was dispatched without an observation: pass reconcile")

    # Hooks: they see documents and never change a decision.
    def on_decision(self, decision: Dict[str, Any]) -> None:
        """The machine's next dispatch or terminal."""

    def on_sleep(self, sleep: Dict[str, Any]) -> None:
        """A wait of the run clock: ``{"from_ms", "until_ms", "ms"}``, and
        ``dispatch``, the attempt it waits for (absent for a wait that is not
        before one, e.g. a reconciliation's)."""

    def on_attempt(self, attempt: Dict[str, Any], judgement: Dict[str, Any]) -> None:
        """An attempt as the core recorded it, and its judgement."""

    def on_terminal(self, receipt: Dict[str, Any]) -> None:
        """The sealed run's receipt."""

    # A driver that hands its caller items as the run goes (:func:`pump_items`).
    def posted(self) -> List[Any]:
        """The items to hand the caller now (taken: emptied)."""
        return []

    def leave(self) -> None:
        """The caller stopped taking items: the run goes on to its end without them."""


def _missing(what: str, path: str, message: str) -> DecodeError:
    return DecodeError("missing_field", f"the host loop cannot {what}: {message}", path)


#: A request to the pump: an adapter method's name and its arguments.
Request = Tuple[str, Tuple[Any, ...]]
#: The pump's reply: ``(True, value)``, or ``(False, exception)`` when the method raised.
Reply = Tuple[bool, Any]


class _Settled(NamedTuple):
    """An attempt that answered: its dispatch effect, when (run clock) and what."""

    effect: Dict[str, Any]
    ordinal: int
    at: int
    ok: bool
    reply: Any


class _Flights:
    """The attempts in flight: sent, not yet observed or cancelled (a plain
    run has at most one, a hedged run more). What the pump reports settled
    waits in ``queue`` until the machine is answered with it; a dropped
    attempt (a loser the machine cancelled) is never answered for."""

    __slots__ = ("flying", "queue")

    def __init__(self) -> None:
        self.flying: Dict[int, Dict[str, Any]] = {}
        self.queue: List[_Settled] = []


def run_loop(machine: Machine, adapter: Adapter) -> Generator[Request, Reply, LoopResult]:
    """Drive ``machine`` to its end, yielding every call of ``adapter`` that
    does I/O to the pump: the one loop of the package."""
    value: Any = None
    # The attempts in flight when the loop stops early are the pump's to cancel.
    flights = _Flights()
    effect = machine.next()
    # Each planned attempt is announced once, at the first effect before it
    # (its wait, its admission, its send).
    hooked = type(adapter).on_decision is not Adapter.on_decision
    announced: List[Any] = [None]
    if hooked:
        _announce(machine, adapter, effect, announced)
    while effect["kind"] != "done":
        event, got = yield from _effects(machine, adapter, flights, effect)
        if got is not _NOTHING:
            value = got
        effect = machine.answer(event)
        if event["kind"] == "observed" and type(adapter).on_attempt is not Adapter.on_attempt:
            seen = machine.observed()
            if seen is not None:
                adapter.on_attempt(seen["attempt"], seen["judgement"])
        if hooked:
            _announce(machine, adapter, effect, announced)
    bundle, receipt_sha256, bundle_json = machine.sealed()
    receipt = bundle["receipt"]
    adapter.on_terminal(receipt)
    if receipt["terminal"] != "completed":
        value = None
    return LoopResult(value, receipt, receipt_sha256, bundle, bundle_json)


_NOTHING = object()

#: The effects a decision of the core is: an attempt to send (an async job's poll and cancel too), or the end.
_DECIDED = frozenset({"dispatch", "poll", "cancel", "done"})


def _announce(machine: Machine, adapter: Adapter, effect: Dict[str, Any], announced: List[Any]) -> None:
    """``on_decision`` once per planned attempt (at its send, or with
    ``announces_plans`` at the first effect before it), and with the run's end."""
    if effect["kind"] in _DECIDED or not adapter.announces_plans:
        if effect["kind"] not in _DECIDED:
            return
        ordinal = None if effect["kind"] == "done" else effect["dispatch"]["ordinal"]
        if effect["kind"] != "done" and ordinal == announced[0]:
            return
        announced[0] = ordinal
        adapter.on_decision(_decision(effect))
        return
    planned = machine.planned()
    if planned is None or planned["ordinal"] == announced[0]:
        return
    announced[0] = planned["ordinal"]
    adapter.on_decision(dict(planned, kind="dispatch"))


def _decision(effect: Dict[str, Any]) -> Dict[str, Any]:
    if effect["kind"] == "done":
        return {"kind": "terminal", "terminal": effect["terminal"]}
    return dict(effect["dispatch"], kind="dispatch")


def _observed(machine: Machine, adapter: Adapter, s: _Settled) -> Dict[str, Any]:
    """The ``observed`` event of a settled attempt: its facts as the adapter
    reads them, its ordinal and when it ended."""
    fields = dict(adapter.observation(s.effect, s.ok, s.reply))
    fields["ordinal"] = s.ordinal
    fields["completed_at_ms"] = max(s.at, int(s.effect["started_at_ms"]), machine.now_ms)
    fields["kind"] = "observed"
    return fields


def _settled_or_due(
    machine: Machine, adapter: Adapter, flights: _Flights, until: Optional[int]
) -> Generator[Request, Reply, Tuple[Dict[str, Any], Any]]:
    """The next attempt to settle, or the clock once it reaches ``until``
    with none settled (never while the caller has cancelled: then only the
    attempts' own answers end the wait)."""
    while True:
        if flights.queue:
            s = flights.queue.pop(0)
            return _observed(machine, adapter, s), (s.reply if s.ok else _NOTHING)
        timed = until is not None and not adapter.cancelled()
        now = adapter.now_ms()
        if until is not None and timed and now >= until:
            return {"kind": "clock", "now_ms": max(now, machine.now_ms)}, _NOTHING
        if not flights.flying:
            raise _missing("wait", "/in_flight", "the machine waits for an attempt this loop never sent")
        ok, reply = yield ("settle", ((until - now) if until is not None and timed else None,))
        if not ok:
            raise reply
        for ordinal, at, good, answer in reply:
            effect = flights.flying.pop(ordinal, None)
            if effect is not None:
                flights.queue.append(_Settled(effect, ordinal, at, good, answer))


def _effects(
    machine: Machine, adapter: Adapter, flights: _Flights, effect: Dict[str, Any]
) -> Generator[Request, Reply, Tuple[Dict[str, Any], Any]]:
    """The event that answers ``effect``, and the value a dispatch or a
    reconciliation gave (``_NOTHING`` otherwise): every effect's I/O, in one place."""
    kind = effect["kind"]
    if kind == "sleep":
        until = int(effect["until_ms"])
        now = adapter.now_ms()
        if now < until and not adapter.cancelled():
            sleep: Dict[str, Any] = {"from_ms": now, "until_ms": until, "ms": until - now}
            planned = machine.planned()
            if planned is not None:
                sleep["dispatch"] = planned
            adapter.on_sleep(sleep)
        while now < until:
            if adapter.cancelled():
                return {"kind": "cancelled", "at_ms": now}, _NOTHING
            ok, reply = yield ("sleep", (until - now,))
            if not ok:
                raise reply
            now = adapter.now_ms()
        if adapter.cancelled():
            return {"kind": "cancelled", "at_ms": now}, _NOTHING
        return {"kind": "clock", "now_ms": now}, _NOTHING
    if kind in ("dispatch", "poll", "cancel"):
        # Not sent yet: a caller's cancellation the adapter reports now stops
        # the run here; the planned cancel of a job left running is sent
        # whatever the caller did.
        if kind != "cancel" and adapter.cancelled_before_send():
            return {"kind": "cancelled", "at_ms": max(adapter.now_ms(), machine.now_ms)}, _NOTHING
        flights.flying[int(effect["dispatch"]["ordinal"])] = effect
        ok, reply = yield ("launch", (effect,))
        if not ok:
            raise reply
        return (yield from _settled_or_due(machine, adapter, flights, effect.get("hedge_at_ms")))
    if kind == "await":
        return (yield from _settled_or_due(machine, adapter, flights, effect.get("hedge_at_ms")))
    if kind == "cancel_attempts":
        # A loser whose answer arrived already is answered for (late, never
        # the run's value); else the first is cancelled now.
        losers = [int(n) for n in effect["ordinals"]]
        for i, s in enumerate(flights.queue):
            if s.ordinal in losers:
                del flights.queue[i]
                return _observed(machine, adapter, s), _NOTHING
        ordinal = losers[0]
        if flights.flying.pop(ordinal, None) is not None:
            ok, reply = yield ("drop", (ordinal,))
            if not ok:
                raise reply
        return {"kind": "attempt_cancelled", "ordinal": ordinal, "at_ms": max(adapter.now_ms(), machine.now_ms)}, _NOTHING
    if kind == "read":
        ok, reply = yield ("read", (list(effect["keys"]),))
        if not ok:
            if isinstance(reply, StoreUnavailableError):
                return {"kind": "store_unavailable", "now_ms": adapter.now_ms()}, _NOTHING
            raise reply
        return {"kind": "read", "now_ms": adapter.now_ms(), "rows": reply}, _NOTHING
    if kind == "write":
        ok, reply = yield ("write", (list(effect["writes"]),))
        if not ok:
            raise reply
        return {"kind": "written", "written": reply}, _NOTHING
    if kind == "append":
        ok, reply = yield ("append", (list(effect["events"]),))
        if not ok:
            raise reply
        return {"kind": "appended" if reply else "append_refused"}, _NOTHING
    if kind == "reconcile":
        at = adapter.now_ms()
        ok, reply = yield ("reconcile", (dict(effect["attempt"]), int(effect["poll"])))
        if not ok:
            raise reply
        answer = dict(reply)
        event: Dict[str, Any] = {"kind": "reconciled", "answer": answer.get("answer"), "at_ms": at}
        if answer.get("cost") is not None:
            event["cost"] = answer["cost"]
        told = answer.get("value") if answer.get("answer") == "succeeded" else _NOTHING
        return event, told
    raise DecodeError("invalid_value", f"the host loop does not know the effect `{kind}`", "/kind")


def pump(loop: Generator[Request, Reply, LoopResult], adapter: Adapter) -> LoopResult:
    """Run the loop in this thread, calling the adapter's methods. An attempt
    is sent and answers before the next request: nothing else is in flight
    meanwhile (a hedge is never due before its lead has answered)."""
    settled: List[Tuple[int, int, bool, Any]] = []
    reply: Optional[Reply] = None
    while True:
        try:
            name, args = loop.send(reply) if reply is not None else next(loop)
        except StopIteration as done:
            result: LoopResult = done.value
            return result
        try:
            if name == "launch":
                effect = args[0]
                try:
                    answered: Tuple[bool, Any] = (True, adapter.dispatch(effect))
                except Exception as exc:
                    answered = (False, exc)
                settled.append((int(effect["dispatch"]["ordinal"]), adapter.now_ms(), *answered))
                reply = (True, None)
            elif name == "settle":
                if not settled and args[0] is not None:
                    adapter.sleep(args[0])
                reply = (True, settled)
                settled = []
            elif name == "drop":
                settled = [s for s in settled if s[0] != args[0]]
                adapter.cancel_attempt(args[0])
                reply = (True, None)
            else:
                reply = (True, getattr(adapter, name)(*args))
        except Exception as exc:
            reply = (False, exc)


async def pump_async(
    loop: Generator[Request, Reply, LoopResult], adapter: Adapter, *, cancellable: bool = False
) -> LoopResult:
    """Run the loop in a task, awaiting the adapter's methods that are
    coroutine functions; each attempt is a task of its own, so that more
    than one can be in flight (a hedged run). A cancellation of the task
    propagates at once and cancels the attempts in flight (each is in
    doubt, as after a crash); with ``cancellable`` it is the caller's
    cancellation of the run instead (``adapter.cancel()``): the attempts in
    flight are cancelled and observed so, a wait ends, and the machine says
    how the run ends (the planned cancel of a job left running included)."""
    tasks: Dict[int, "asyncio.Future[Any]"] = {}
    ended: Dict[int, int] = {}
    ready: List[Tuple[int, int, bool, Any]] = []

    def launch(effect: Dict[str, Any]) -> None:
        ordinal = int(effect["dispatch"]["ordinal"])
        try:
            got = adapter.dispatch(effect)
        except Exception as exc:
            ready.append((ordinal, adapter.now_ms(), False, exc))
            return
        if not inspect.isawaitable(got):
            ready.append((ordinal, adapter.now_ms(), True, got))
            return
        task = asyncio.ensure_future(got)
        tasks[ordinal] = task
        task.add_done_callback(functools.partial(_ended_at, ended, ordinal, adapter))

    async def settle(ms: Optional[int]) -> List[Tuple[int, int, bool, Any]]:
        if not ready and not any(t.done() for t in tasks.values()):
            # What has answered already settles before a timed wait starts.
            if ms is not None:
                await asyncio.sleep(0)
            if not any(t.done() for t in tasks.values()):
                waits: List["asyncio.Future[Any]"] = list(tasks.values())
                sleeper = None
                if ms is not None:
                    sleeper = asyncio.ensure_future(_awaited(adapter.sleep(ms)))
                    waits.append(sleeper)
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    if not cancellable:
                        raise
                    # The caller cancelled the run: the attempts in flight
                    # are cancelled and answered for as cancelled.
                    adapter.cancel()
                    for t in tasks.values():
                        t.cancel()
                    if tasks:
                        await asyncio.wait(list(tasks.values()))
                finally:
                    if sleeper is not None and not sleeper.done():
                        sleeper.cancel()
        out = list(ready)
        ready.clear()
        for ordinal, task in list(tasks.items()):
            if not task.done():
                continue
            del tasks[ordinal]
            at = ended.pop(ordinal, adapter.now_ms())
            if task.cancelled():
                out.append((ordinal, at, False, asyncio.CancelledError()))
            elif task.exception() is not None:
                out.append((ordinal, at, False, task.exception()))
            else:
                out.append((ordinal, at, True, task.result()))
        return out

    reply: Optional[Reply] = None
    try:
        while True:
            try:
                name, args = loop.send(reply) if reply is not None else next(loop)
            except StopIteration as done:
                result: LoopResult = done.value
                return result
            try:
                if name == "launch":
                    launch(args[0])
                    got: Any = None
                elif name == "settle":
                    got = await settle(args[0])
                elif name == "sleep" and cancellable:
                    try:
                        got = await _awaited(adapter.sleep(*args))
                    except asyncio.CancelledError:
                        adapter.cancel()  # the loop answers the wait `cancelled`
                        got = None
                elif name == "drop":
                    task = tasks.pop(args[0], None)
                    if task is not None:
                        task.cancel()
                    ready[:] = [r for r in ready if r[0] != args[0]]
                    adapter.cancel_attempt(args[0])
                    got = None
                else:
                    got = getattr(adapter, name)(*args)
                if inspect.isawaitable(got):
                    got = await got
                reply = (True, got)
            except Exception as exc:
                reply = (False, exc)
    finally:
        for task in tasks.values():
            task.cancel()


def _ended_at(ended: Dict[int, int], ordinal: int, adapter: Adapter, _task: Any) -> None:
    """When attempt ``ordinal`` settled, on the run clock."""
    ended[ordinal] = adapter.now_ms()


async def _awaited(x: Any) -> Any:
    return (await x) if inspect.isawaitable(x) else x


def store_read(store: Any, namespace: str, keys: List[str]) -> List[Dict[str, Any]]:
    """A fleet read from a register store (``get``): one row per key."""
    rows: List[Dict[str, Any]] = []
    for key in keys:
        document, generation = store.get(f"{namespace}/{key}")
        row: Dict[str, Any] = {"generation": generation}
        if document is not None:
            row["document"] = document
        rows.append(row)
    return rows


def store_write(store: Any, namespace: str, writes: List[Dict[str, Any]]) -> int:
    """A fleet write to a register store (``compare_and_set``), in order, up to the first refused."""
    written = 0
    for w in writes:
        ok, _ = store.compare_and_set(f"{namespace}/{w['key']}", int(w["expected_generation"]), w["document"])
        if not ok:
            break
        written += 1
    return written


class Answer(NamedTuple):
    """The last item of a dispatch's async generator (:func:`pump_items_async`): the attempt's answer."""

    value: Any


def pump_items(loop: Generator[Request, Reply, LoopResult], adapter: Adapter) -> Generator[Any, None, LoopResult]:
    """:func:`pump` for a driver that hands its caller items as the run goes
    (a stream's events): a ``dispatch`` that answers with a generator
    yields its items to the caller and its return value is the attempt's
    answer; what the adapter ``posted()`` after each step is yielded too. A
    caller that stops taking items (the generator closed) is the adapter's
    ``leave()``: nothing more is yielded and the run goes on to its end."""
    out: List[Any] = []
    settled: List[Tuple[int, int, bool, Any]] = []
    reply: Optional[Reply] = None
    items: Optional[Generator[Any, None, Any]] = None
    ordinal = 0
    left = False
    result: Optional[LoopResult] = None
    while True:
        # The one place items reach the caller.
        while out:
            item = out.pop(0)
            if left:
                continue
            try:
                yield item
            except GeneratorExit:
                left = True
                out.clear()
                adapter.leave()
        if items is not None:
            try:
                out.append(next(items))
                continue
            except StopIteration as end:
                settled.append((ordinal, adapter.now_ms(), True, end.value))
            except Exception as exc:
                settled.append((ordinal, adapter.now_ms(), False, exc))
            items = None
            reply = (True, None)
        if result is not None:
            return result
        try:
            name, args = loop.send(reply) if reply is not None else next(loop)
        except StopIteration as done:
            result = adapter.result = done.value
            out.extend(adapter.posted())
            continue
        out.extend(adapter.posted())
        try:
            if name == "launch":
                ordinal = int(args[0]["dispatch"]["ordinal"])
                try:
                    got = adapter.dispatch(args[0])
                except Exception as exc:
                    settled.append((ordinal, adapter.now_ms(), False, exc))
                else:
                    if inspect.isgenerator(got):
                        items = got  # type: ignore[assignment]
                        continue
                    settled.append((ordinal, adapter.now_ms(), True, got))
                reply = (True, None)
            elif name == "settle":
                if not settled and args[0] is not None:
                    adapter.sleep(args[0])
                reply = (True, settled)
                settled = []
            else:
                reply = (True, getattr(adapter, name)(*args))
        except Exception as exc:
            reply = (False, exc)


async def pump_items_async(loop: Generator[Request, Reply, LoopResult], adapter: Adapter) -> AsyncGenerator[Any, None]:
    """:func:`pump_items` awaiting the adapter: a ``dispatch`` may answer
    with an async generator whose items are yielded, its last item the
    attempt's :class:`Answer`. The caller's cancellation of its task during
    a wait is the adapter's ``cancel()`` (the wait ends and the machine says
    how the run ends); ``adapter.result`` is the run's once the items end."""
    out: List[Any] = []
    settled: List[Tuple[int, int, bool, Any]] = []
    reply: Optional[Reply] = None
    left = False
    while True:
        while out:
            item = out.pop(0)
            if left:
                continue
            try:
                yield item
            except GeneratorExit:
                left = True
                out.clear()
                adapter.leave()
        try:
            name, args = loop.send(reply) if reply is not None else next(loop)
        except StopIteration as done:
            adapter.result = done.value
            for item in [] if left else adapter.posted():
                yield item
            return
        out.extend(adapter.posted())
        try:
            if name == "launch":
                ordinal = int(args[0]["dispatch"]["ordinal"])
                got: Any = adapter.dispatch(args[0])
                if inspect.isasyncgen(got):
                    async for item in got:
                        if isinstance(item, Answer):
                            got = item.value
                            break
                        if left:
                            continue
                        try:
                            yield item
                        except GeneratorExit:
                            left = True
                            adapter.leave()
                elif inspect.isawaitable(got):
                    got = await got
                settled.append((ordinal, adapter.now_ms(), True, got))
                reply = (True, None)
            elif name == "settle":
                if not settled and args[0] is not None:
                    await _awaited(adapter.sleep(args[0]))
                reply = (True, settled)
                settled = []
            elif name == "sleep":
                try:
                    await _awaited(adapter.sleep(*args))
                except asyncio.CancelledError:
                    adapter.cancel()  # the loop answers the wait `cancelled`
                reply = (True, None)
            else:
                reply = (True, await _awaited(getattr(adapter, name)(*args)))
        except Exception as exc:
            reply = (False, exc)
