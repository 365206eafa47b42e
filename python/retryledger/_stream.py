"""The streaming drivers: hosts of the core's stream contract (docs/STREAMING.md),
as adapters of the host loop (docs/HOST_LOOP.md).

``run_stream`` and ``run_stream_async`` run on the one loop over the core's
run machine, with the options of every driver on it (fleet, hooks, clock and
sleep, key scope, price schedule, task cancellation), for a
``dispatch(step)`` that returns the provider's stream (an iterable of
provider events; for the async driver an async iterable, or an awaitable of
one). The machine plans each attempt; its ``dispatch`` effect carries the
attempt's stream plan (deliver live or buffered, how many events without
text to hold back until the first text, when the first event is due, the
idle limit and the byte bound). The adapter reads the stream under it,
extracts its facts (events, bytes of delta text, the provider's sequence
numbers, response id, terminal and usage events, protocol violations) and
answers the machine with one delta text per provider event, and the
consumer receives its events, :class:`StreamEvent`, exactly as the core logs
them (``retryledger.stream_event.v1``, the sealed bundle's ``stream_events``):

* every provider event is a ``delta`` (``data`` is the provider event,
  ``text`` its delta text, ``""`` for an event without text): ``tentative``
  as it arrives under ``tentative``, ``continuation`` and ``restart``;
  ``committed`` under ``buffer``, delivered only once the run completed;
* in live modes a fresh attempt's events without text (a role chunk,
  ``response.created``, ``message_start``, ``ping``) are held back, as the
  plan says, until its first text, then delivered in order before it (or at
  the end of a stream with its terminal event): a stream that breaks before
  any text delivered nothing, so its retry is invisible;
* ``commit`` once, when the run completes;
* ``invalidate`` when the core voids a failed attempt's events, before any
  event of a later attempt; a run that does not complete then raises what
  ``run`` raises (:class:`RunStoppedError` and its subclasses);
* under ``continuation``, ``step.continuation`` is the planned resumption
  (``{"continues_ordinal", "response_id", "starting_after"}``) or ``None``;
  ``dispatch`` must then resume that provider response, and the resumed
  events continue the output.

A :class:`StreamReader` tells the driver what a provider event means; the
default reads ``str`` items (each one a delta, the end of iteration is the
terminal event). The host detects protocol violations (a sequence number that
does not increase, a resumption that does not start right after
``starting_after``, one event or the whole response over the plan's
``max_response_bytes``, a JSON decode error mid-stream, impossible usage),
stops reading, closes the stream and reports the violation; memory stays
bounded by ``max_response_bytes``.

Timeouts (the first event by the plan's ``first_event_by_ms``, then
``idle_timeout_ms`` between events, each capped by the run's deadline): the
async driver arms one timer per attempt, re-armed from the last event, and
cancels its own read only when the stream was really idle that long. The sync
driver cannot interrupt a blocking read: ``step.timeout_s`` is the read
timeout to give the SDK, and the driver checks the time after each event. On
expiry the stream is closed and the attempt reported as a ``timeout``.

A consumer that stops early closes the provider stream; the in-flight
attempt is recorded as cancelled and the run sealed (``.terminal``,
``.bundle`` afterwards). Sync: ``break`` (the dropped iterator is closed at
once), ``close()`` or a ``with`` block. Async: ``aclose()``, an ``async with``
block or a cancelled task (an async generator left after ``break`` is only
finalized by the event loop later, so close it).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import weakref
from dataclasses import dataclass
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Generator,
    Iterable,
    Iterator,
    List,
    Literal,
    Mapping,
    Optional,
    Protocol,
    Tuple,
    TypeVar,
    Union,
)

from . import _core
from ._api import Document, Policy
from ._driver import (
    AttemptCallback,
    Classifier,
    DecisionCallback,
    MachineStep,
    RunCancelledError,
    RunStoppedError,
    SleepCallback,
    TerminalCallback,
    UnrecognizedDispatchError,
    _async_sleep_ms,
    _checked,
    _fleet_for,
    _monotonic_ms,
    _schedule_for,
    _sleep_ms,
    _wall_ms,
    facts_of,
)
from ._errors import RetryledgerError
from ._loop import Answer, LoopResult, Machine, pump_items, pump_items_async, run_loop
from .fleet import Fleet
from .journaled import _MachineSealed
from .machine import FleetAdapter, fleet_options


__all__ = [
    "StreamEvent",
    "StreamReader",
    "TextReader",
    "StreamProtocolError",
    "StreamTimeoutError",
    "StreamStep",
    "StreamRun",
    "AsyncStreamRun",
    "run_stream",
    "run_stream_async",
]

E = TypeVar("E")
E_contra = TypeVar("E_contra", contravariant=True)

_Facts = _core.Facts
_Terminal = _core.Terminal

Violation = Literal[
    "malformed_event",
    "event_too_large",
    "response_too_large",
    "sequence_back",
    "sequence_gap",
    "impossible_usage",
]


@dataclass(frozen=True)
class StreamEvent:
    """One event the consumer receives, as the core logs it.

    ``kind`` is ``delta``, ``commit`` or ``invalidate``; ``status``
    ``tentative``, ``committed`` or ``invalidated``; ``attempt`` the attempt's
    ordinal (for a commit or invalidate: the last attempt of the chain it
    closes); ``sequence`` the position in the consumer's stream, from 1. A
    delta carries the provider event (``data``) and its delta text (``text``).
    """

    __slots__ = ("kind", "status", "attempt", "sequence", "data", "text")

    kind: str
    status: str
    attempt: int
    sequence: int
    data: Any
    text: Optional[str]

    def __init__(
        self, kind: str, status: str, attempt: int, sequence: int, data: Any = None, text: Optional[str] = None
    ) -> None:
        _set = object.__setattr__
        _set(self, "kind", kind)
        _set(self, "status", status)
        _set(self, "attempt", attempt)
        _set(self, "sequence", sequence)
        _set(self, "data", data)
        _set(self, "text", text)


def _event(kind: str, status: str, attempt: int, sequence: int, data: Any = None, text: Optional[str] = None) -> StreamEvent:
    """A StreamEvent built without the per-field ``object.__setattr__`` calls."""
    ev = _new(StreamEvent)
    _kind_slot(ev, kind)
    _status_slot(ev, status)
    _attempt_slot(ev, attempt)
    _sequence_slot(ev, sequence)
    _data_slot(ev, data)
    _text_slot(ev, text)
    return ev


_new = object.__new__
_kind_slot = vars(StreamEvent)["kind"].__set__
_status_slot = vars(StreamEvent)["status"].__set__
_attempt_slot = vars(StreamEvent)["attempt"].__set__
_sequence_slot = vars(StreamEvent)["sequence"].__set__
_data_slot = vars(StreamEvent)["data"].__set__
_text_slot = vars(StreamEvent)["text"].__set__


class StreamReader(Protocol[E_contra]):
    """What a provider event means to the driver.

    ``text``: the event's delta text (``""`` when it has none); ``sequence``:
    the provider's sequence number, if it numbers events; ``response_id``: the
    provider's response id, if the event carries it; ``is_terminal``: the
    provider's terminal event; ``usage``: price units (kind -> count) the
    event reports, if any (later reports of a kind replace earlier ones; the
    attempt is charged their sum when the run has a price schedule).

    ``terminal_at_end`` (optional, default false): the normal end of the
    iteration is the terminal event (a plain iterable of deltas).
    A reader may raise :class:`StreamProtocolError` for an event it cannot read.

    A reader may also define ``read(event) -> (text, sequence, is_terminal,
    usage)``: the driver then calls it once per event instead of the four
    methods (``response_id`` is still asked until an event answers).
    """

    def text(self, event: E_contra) -> str: ...

    def sequence(self, event: E_contra) -> Optional[int]: ...

    def response_id(self, event: E_contra) -> Optional[str]: ...

    def is_terminal(self, event: E_contra) -> bool: ...

    def usage(self, event: E_contra) -> Optional[Mapping[str, Any]]: ...


class TextReader:
    """The default reader: each item is a ``str`` delta; the normal end of the
    iteration is the terminal event; no sequence numbers, id or usage."""

    terminal_at_end = True

    def text(self, event: Any) -> str:
        if not isinstance(event, str):
            raise StreamProtocolError("malformed_event", f"expected a str delta, got {type(event).__name__}")
        return event

    def sequence(self, event: Any) -> Optional[int]:
        return None

    def response_id(self, event: Any) -> Optional[str]:
        return None

    def is_terminal(self, event: Any) -> bool:
        return False

    def usage(self, event: Any) -> Optional[Mapping[str, Any]]:
        return None


_TEXT_READER = TextReader()


class StreamProtocolError(Exception):
    """A broken stream protocol the host detected (``violation``: one of
    ``malformed_event``, ``event_too_large``, ``response_too_large``,
    ``sequence_back``, ``sequence_gap``, ``impossible_usage``)."""

    def __init__(self, violation: Violation, message: str = "") -> None:
        super().__init__(violation, message)
        self.violation: Violation = violation

    def __str__(self) -> str:
        return f"{self.violation}: {self.args[1]}" if self.args[1] else self.violation


class StreamTimeoutError(TimeoutError):
    """No stream event came within the first-byte or idle timeout (or before
    the run's deadline): the stream was closed and the attempt is a ``timeout``."""


class StreamStep(MachineStep):
    """A planned streamed attempt: a :class:`Step` with the stream's timing
    and the planned continuation."""

    first_byte_timeout_s: Optional[float] = None
    idle_timeout_s: Optional[float] = None

    @property
    def continuation(self) -> Optional[Dict[str, Any]]:
        """The provider response to resume (``continues_ordinal``,
        ``response_id``, ``starting_after``), or ``None`` for a new request."""
        return self.plan.continuation

    @property
    def timeout_s(self) -> float:
        """The read timeout to give the SDK, seconds: the longer of the
        first-event and idle limits the plan sets, capped by what is left
        of the run's deadline (that alone without either)."""
        left = self.remaining_ms / 1000.0
        limits = [t for t in (self.first_byte_timeout_s, self.idle_timeout_s) if t is not None]
        return min(max(limits), left) if limits else left


class _Reading:
    """What one attempt's stream said so far (the facts' ``stream`` part),
    read under the machine's stream plan."""

    __slots__ = (
        "deltas",
        "bytes",
        "last_sequence",
        "response_id",
        "terminal",
        "usage",
        "usage_event",
        "violation",
        "hold",
        "held",
        "ordinal",
        "opened",
    )

    def __init__(self, hold: int, response_id: Optional[str], ordinal: int) -> None:
        self.ordinal = ordinal
        self.deltas: List[str] = []
        self.bytes = 0
        self.last_sequence: Optional[int] = None
        self.response_id = response_id
        self.terminal = False
        #: Price units reported so far (charged even when the events are dropped).
        self.usage: Optional[Dict[str, Any]] = None
        self.usage_event = False
        self.violation: Optional[str] = None
        #: Events without text held back until the first text, at most ``hold`` (the plan's).
        self.hold = hold
        self.held: List[Any] = []
        self.opened = False

    def facts(self) -> Dict[str, Any]:
        part: Dict[str, Any] = {
            "bytes": self.bytes,
            "events": len(self.deltas),
            "terminal_event": self.terminal,
            "usage_event": self.usage_event,
        }
        if self.last_sequence is not None:
            part["last_sequence"] = self.last_sequence
        if self.response_id is not None and self.deltas:
            part["response_id"] = self.response_id
        if self.violation is not None:
            part["violation"] = self.violation
        return part


def _usage_ok(units: Mapping[str, Any]) -> bool:
    for count in units.values():
        if type(count) is not int or count < 0:
            return False
    return True


def _is_malformed(exc: BaseException) -> bool:
    """A JSON decode error along the cause/context chain (an SDK that could not
    parse an event)."""
    seen = 0
    e: Optional[BaseException] = exc
    while e is not None and seen < 8:
        if isinstance(e, json.JSONDecodeError):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass


async def _aclose(stream: Any) -> None:
    close = getattr(stream, "aclose", None)
    if close is None:
        close = getattr(stream, "close", None)
    if close is not None:
        try:
            result = close()
            if inspect.isawaitable(result):
                await result
        except Exception:
            pass


class _Left(Exception):
    """The consumer stopped reading during the attempt."""


class _Streamed(FleetAdapter):
    """A streamed run as the host loop's adapter: each ``dispatch`` opens the
    caller's stream and reads it under the machine's stream plan (a
    generator of the consumer's events, answering with the attempt's
    facts); after each observation the core's judgement says whether the
    pending output is committed or invalidated (:meth:`posted`)."""

    def __init__(self, key: str, send: Callable[[StreamStep], Any], reader: Any, schedule: Optional[str], o: Dict[str, Any]) -> None:
        self.key = key
        self.send = send
        self.reader = reader
        self.plain = reader is _TEXT_READER
        self.terminal_at_end = bool(getattr(reader, "terminal_at_end", False))
        self.r_all: Optional[Callable[[Any], Tuple[str, Optional[int], bool, Optional[Mapping[str, Any]]]]] = getattr(
            reader, "read", None
        )
        self.schedule = schedule
        now = o["now"]
        # The caller's run clock (ms since admission) is never re-zeroed.
        self.clock: Callable[[], float] = (lambda: float(now())) if now is not None else (o["clock"] or _monotonic_ms)
        self.fixed = now is not None
        self.t0 = 0.0 if self.fixed else self.clock()
        self.last = 0
        self.pause: Callable[[float], Any] = o["sleep"]
        self.wall_clock: Callable[[], float] = o["wall_clock"] or _wall_ms
        self.classify: Optional[Classifier] = o["classify"]
        self.use_fleet(o["fleet"])
        self.hooks = (o["on_decision"], o["on_sleep"], o["on_attempt"], o["on_terminal"])
        #: The consumer's sequence: events handed out (or dropped after it left).
        self.sequence = 0
        self.out: List[StreamEvent] = []
        #: Buffered events of the attempt read last, delivered with its commit.
        self.buffer: List[Tuple[Any, str]] = []
        self.left = False
        self.was_cancelled = False
        self.last_error: Optional[BaseException] = None
        self.rule: Any = None
        self.result: Optional[LoopResult] = None
        self.checker: Optional[_core.Compiled] = None

    def now_ms(self) -> int:
        t = int(self.clock() - self.t0)
        if t > self.last:
            self.last = t
        return self.last

    def sleep(self, ms: int) -> Any:
        return self.pause(ms)

    def begin(self) -> None:
        """The run begins (its first iteration): the run clock starts at 0."""
        if not self.fixed:
            self.t0 = self.clock()

    def cancelled(self) -> bool:
        return self.was_cancelled or self.left

    def cancelled_before_send(self) -> bool:
        return self.cancelled()

    def cancel(self) -> None:
        self.was_cancelled = True

    def leave(self) -> None:
        self.left = True

    #: The consumer's task was cancelled: it takes no more events.
    silent = False

    def posted(self) -> List[Any]:
        out, self.out = self.out, []
        return [] if self.silent else out

    def event(self, kind: str, status: str, attempt: int, data: Any = None, text: Optional[str] = None) -> StreamEvent:
        self.sequence += 1
        return _event(kind, status, attempt, self.sequence, data, text)

    announced = 0

    def on_decision(self, decision: Dict[str, Any]) -> None:
        # A dispatch is announced once: before the wait for it, when there is one.
        if decision.get("kind") == "dispatch":
            if decision["ordinal"] == self.announced:
                return
            self.announced = int(decision["ordinal"])
        FleetAdapter.on_decision(self, decision)

    def on_sleep(self, sleep: Dict[str, Any]) -> None:
        d = sleep.get("dispatch")
        if d is not None:
            self.on_decision(dict(d, kind="dispatch"))
        FleetAdapter.on_sleep(self, sleep)

    def on_attempt(self, attempt: Dict[str, Any], judgement: Dict[str, Any]) -> None:
        self.rule = judgement.get("rule")
        FleetAdapter.on_attempt(self, attempt, judgement)
        ordinal = int(attempt["ordinal"])
        action = judgement.get("stream")
        if action == "commit":
            for data, text in self.buffer:
                self.out.append(self.event("delta", "committed", ordinal, data, text))
            self.out.append(self.event("commit", "committed", ordinal))
        elif action == "invalidate":
            self.out.append(self.event("invalidate", "invalidated", ordinal))
        self.buffer = []

    # ---- one attempt ------------------------------------------------------

    def start(self, effect: Dict[str, Any]) -> Tuple[StreamStep, _Reading, Dict[str, Any]]:
        plan = effect["stream"]
        step = StreamStep(effect, self.key, self.schedule)
        # A policy bound from a template checks each SDK call against its request (request_drift).
        step._compiled = self.checker
        started = step.started_at_ms
        first = plan.get("first_event_by_ms")
        idle = plan.get("idle_timeout_ms")
        step.first_byte_timeout_s = None if first is None else (first - started) / 1000.0
        step.idle_timeout_s = None if idle is None else idle / 1000.0
        c = step.continuation
        reading = _Reading(int(plan["hold_without_text"]), None if c is None else c["response_id"], step.ordinal)
        return step, reading, plan

    def take(self, reading: _Reading, step: StreamStep, plan: Dict[str, Any], ev: Any) -> List[StreamEvent]:
        """Take one provider event: the consumer's events now (none when
        buffered or held back). Raises :class:`StreamProtocolError` on a
        violation (the event is not taken)."""
        if self.plain:
            if type(ev) is not str:
                raise StreamProtocolError("malformed_event", f"expected a str delta, got {type(ev).__name__}")
            text, seq, terminal, units = ev, None, False, None
        elif self.r_all is not None:
            text, seq, terminal, units = self.r_all(ev)
        else:
            r = self.reader
            text, seq, terminal, units = r.text(ev), r.sequence(ev), r.is_terminal(ev), r.usage(ev)
        if not isinstance(text, str):
            raise StreamProtocolError("malformed_event", "the reader's delta text is not a str")
        n = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        limit = int(plan["max_response_bytes"])
        if n > limit:
            raise StreamProtocolError("event_too_large", f"one event of {n} bytes over max_response_bytes {limit}")
        if reading.bytes + n > limit:
            raise StreamProtocolError("response_too_large", f"over max_response_bytes {limit}")
        if seq is not None:
            last = reading.last_sequence
            if last is None:
                c = step.continuation
                if c is not None and seq != c["starting_after"] + 1:
                    raise StreamProtocolError(
                        "sequence_gap" if seq > c["starting_after"] else "sequence_back",
                        f"a resumption after {c['starting_after']} started at {seq}",
                    )
            elif seq <= last:
                raise StreamProtocolError("sequence_back", f"sequence number {seq} after {last}")
        if units is not None:
            if not _usage_ok(units):
                raise StreamProtocolError("impossible_usage", "usage counts must be nonnegative integers")
            reading.usage = dict(units) if reading.usage is None else {**reading.usage, **units}
            reading.usage_event = True
        if reading.response_id is None and not self.plain:
            reading.response_id = self.reader.response_id(ev)
        if seq is not None:
            reading.last_sequence = seq
        if terminal:
            reading.terminal = True
        reading.bytes += n
        reading.deltas.append(text)
        if plan["deliver"] != "live":
            self.buffer.append((ev, text))
            return []
        out: List[StreamEvent] = []
        if reading.hold:
            if not text and len(reading.held) < reading.hold:
                reading.held.append(ev)
                return out
            out = self.release(reading)
        out.append(self.event("delta", "tentative", reading.ordinal, ev, text))
        return out

    def release(self, reading: _Reading) -> List[StreamEvent]:
        """Deliver the held events, in order."""
        reading.hold = 0
        out = [self.event("delta", "tentative", reading.ordinal, ev, "") for ev in reading.held]
        reading.held = []
        return out

    def ended(self, reading: _Reading) -> List[StreamEvent]:
        """The iteration ended normally: held events are delivered with the terminal event."""
        if self.terminal_at_end:
            reading.terminal = True
        return self.release(reading) if reading.held and reading.terminal else []

    def answer(self, step: StreamStep, reading: _Reading, error: Optional[BaseException], cancelled: bool) -> Dict[str, Any]:
        """The ``observed`` event's fields of the attempt."""
        if reading.held:
            # Ended before its first text: the held events never reached the consumer.
            reading.held = []
            reading.deltas = []
            reading.last_sequence = None
            reading.terminal = False
            reading.usage_event = False
        if isinstance(error, StreamProtocolError):
            reading.violation = error.violation
        elif error is not None and not cancelled and _is_malformed(error):
            reading.violation = "malformed_event"
        if reading.usage is not None and reading.violation is None and self.schedule is not None:
            try:
                step.usage(reading.usage)
            except Exception as exc:  # usage the schedule refuses: the attempt ends as an error
                error = exc
        if reading.usage is not None and step._tokens is None:
            # The stream's usage settles the attempt's token reservation (admission limits).
            step.tokens_used(sum(v for v in reading.usage.values() if isinstance(v, int) and not isinstance(v, bool) and v > 0))
        part = reading.facts() if reading.opened else None
        if error is None and not cancelled:
            facts: Dict[str, Any] = {"result": "returned"}
        elif reading.violation is not None and not cancelled:
            facts = {"result": "raised", "error_types": ["StreamProtocolError"]}
        elif isinstance(error, StreamTimeoutError) and not cancelled:
            facts = {"result": "raised", "error_types": ["StreamTimeoutError"], "transport_error": "timeout"}
        else:
            assert error is not None
            if step._refused is not None:
                raise step._refused
            if isinstance(error, RetryledgerError) and hasattr(error, "_facts") and not cancelled:
                facts = error._facts.to_dict()
            else:
                ms = int(self.wall_clock())
                facts = facts_of(
                    error,
                    classify=None if cancelled else self.classify,
                    output_delivered=step._delivered,
                    cancelled=cancelled,
                    now_unix_ms=ms if ms > 0 else 0,
                ).to_dict()
        if part is not None:
            facts["stream"] = part
        if error is not None and not cancelled:
            self.last_error = error
        fields = step.observation(True, None, None, 0)
        fields["facts"] = facts
        if reading.deltas:
            fields["deltas"] = reading.deltas
        if step._tokens is not None:
            fields["used_tokens"] = step._tokens
        return fields

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        if not ok:
            raise reply
        return reply  # type: ignore[no-any-return]

    def dispatch(self, effect: Dict[str, Any]) -> Generator[StreamEvent, None, Dict[str, Any]]:
        """Open and read the stream (sync): the consumer's events, then the observation."""
        step, reading, plan = self.start(effect)
        deadline = int(step.plan.deadline_ms)
        idle = plan.get("idle_timeout_ms")
        until = plan.get("first_event_by_ms", deadline)
        error: Optional[BaseException] = None
        cancelled = False
        stream: Any = None
        try:
            stream = self.send(step)
            it = iter(stream)
            reading.opened = True
            for ev in it:
                now = self.now_ms()
                if now > until and not (until >= deadline and self._is_terminal(ev)):
                    raise StreamTimeoutError("no stream event within the first-byte or idle timeout")
                for out in self.take(reading, step, plan, ev):
                    if self.left:
                        raise _Left()
                    yield out
                if self.left:
                    raise _Left()
                now = self.now_ms()
                until = deadline if idle is None else min(now + idle, deadline)
            for out in self.ended(reading):
                yield out
        except _Left:
            cancelled = True
            error = _Left()
            _close(stream)
        except Exception as exc:
            error = exc
            _close(stream)
        return self.answer(step, reading, error, cancelled)

    def _is_terminal(self, ev: Any) -> bool:
        return not self.plain and bool(self.reader.is_terminal(ev))

    async def dispatch_async(self, effect: Dict[str, Any]) -> AsyncGenerator[Any, None]:
        """Open and read the stream (async): the consumer's events, then the observation's :class:`Answer`."""
        step, reading, plan = self.start(effect)
        deadline_ms = int(step.plan.deadline_ms)
        idle = plan.get("idle_timeout_ms")
        first = plan.get("first_event_by_ms")
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        now = self.now_ms()
        dog = _Watchdog(
            loop,
            task,
            None if first is None else max(0, first - now) / 1000.0,
            None if idle is None else idle / 1000.0,
            loop.time() + max(0, deadline_ms - now) / 1000.0,
        )
        error: Optional[BaseException] = None
        cancelled = False
        stream: Any = None
        until = first if first is not None else deadline_ms
        try:
            try:
                opened = self.send(step)
                if inspect.isawaitable(opened):
                    opened = await opened
                stream = opened
                if hasattr(stream, "__aiter__"):
                    ait = stream.__aiter__()
                    sync_it = None
                else:
                    sync_it = iter(stream)
                reading.opened = True
                while True:
                    dog.since = loop.time()
                    dog.waiting = True
                    if sync_it is None:
                        try:
                            ev = await ait.__anext__()
                        except StopAsyncIteration:
                            break
                    else:
                        try:
                            ev = next(sync_it)
                        except StopIteration:
                            break
                        # A blocking iterable: the timer cannot interrupt it; check after the event.
                        t = self.now_ms()
                        if t > until and not (until >= deadline_ms and self._is_terminal(ev)):
                            raise StreamTimeoutError("no stream event within the first-byte or idle timeout")
                    dog.waiting = False
                    if dog.first:
                        dog.first_event()
                    for out in self.take(reading, step, plan, ev):
                        if not self.left:
                            yield out
                    if self.left:
                        raise _Left()
                    if sync_it is not None:
                        t = self.now_ms()
                        until = deadline_ms if idle is None else min(t + idle, deadline_ms)
                dog.waiting = False
                for out in self.ended(reading):
                    if not self.left:
                        yield out
            except asyncio.CancelledError:
                if not dog.fired:
                    # The caller cancelled the task: the attempt is cancelled, the run ends.
                    self.was_cancelled = self.silent = True
                    cancelled = True
                    error = asyncio.CancelledError()
                else:
                    _uncancel(task)
                    error = StreamTimeoutError(
                        "no stream event within the first-byte or idle timeout"
                        if reading.opened
                        else "the stream did not open within the first-byte timeout"
                    )
                await _aclose(stream)
            except _Left:
                cancelled = True
                error = _Left()
                await _aclose(stream)
            except Exception as exc:
                error = exc
                await _aclose(stream)
        finally:
            dog.stop()
        yield Answer(self.answer(step, reading, error, cancelled))


class _Watchdog:
    """One timer per attempt on the event loop, re-armed lazily: it cancels the
    reading task only when a wait for the provider really lasted the limit."""

    __slots__ = ("loop", "task", "first_s", "idle_s", "deadline", "since", "waiting", "first", "fired", "handle")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, task: "asyncio.Task[Any]", first_s: Optional[float], idle_s: Optional[float], deadline: float
    ) -> None:
        self.loop = loop
        self.task = task
        self.first_s = first_s
        self.idle_s = idle_s
        self.deadline = deadline
        self.since = loop.time()
        self.waiting = True
        self.first = True
        self.fired = False
        self.handle: Optional[asyncio.TimerHandle] = None
        self._arm()

    def _due(self) -> float:
        limit = self.first_s if self.first else self.idle_s
        due = self.deadline if limit is None else self.since + limit
        return due if due < self.deadline else self.deadline

    def _arm(self) -> None:
        self.handle = self.loop.call_at(self._due(), self._fire)

    def _fire(self) -> None:
        self.handle = None
        if self.fired:
            return
        now = self.loop.time()
        if self.waiting:
            due = self._due()
            if now >= due:
                self.fired = True
                self.task.cancel()
                return
            self.handle = self.loop.call_at(due, self._fire)
        else:
            limit = self.idle_s
            nxt = now + limit if limit is not None else self.deadline
            self.handle = self.loop.call_at(nxt if nxt < self.deadline else self.deadline, self._fire)

    def first_event(self) -> None:
        """The first event came: from now on the idle limit applies (re-armed
        once when it is sooner than the first-byte limit was)."""
        self.first = False
        if self.first_s != self.idle_s:
            self.stop()
            self.since = self.loop.time()
            self._arm()

    def stop(self) -> None:
        handle = self.handle
        if handle is not None:
            handle.cancel()
            self.handle = None


def _uncancel(task: "asyncio.Task[Any]") -> None:
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


class _Run:
    """What the sync and async stream runs share: the machine, the adapter and the sealed run."""

    def __init__(self, machine: Machine, adapter: _Streamed) -> None:
        self._machine = machine
        self._adapter = adapter
        self._result: Optional[LoopResult] = None

    def _end(self, result: LoopResult) -> List[StreamEvent]:
        """The run ended: sealed; the events the core logged past those handed out."""
        self._result = result
        a = self._adapter
        out: List[StreamEvent] = []
        for e in result.bundle.get("stream_events") or []:
            if e["sequence"] > a.sequence and not a.left and not a.silent:
                out.append(a.event(e["kind"], e["status"], int(e["attempt_ordinal"])))
        return out

    def _failure(self) -> Optional[BaseException]:
        """After the last event: ``None`` when the run completed (or the consumer left), else the error to raise."""
        result = self._result
        a = self._adapter
        if result is None or result.terminal == "completed" or a.left:
            return None
        sealed: Any = _MachineSealed(result)
        if a.was_cancelled:
            return RunCancelledError(sealed)
        count = result.receipt["attempt_count"]
        message = f"run ended with {result.terminal} after {count} attempt{'s' if count != 1 else ''}"
        if a.rule == "unrecognized":
            return UnrecognizedDispatchError(sealed, f"{message}; unrecognized {type(a.last_error).__name__}")
        return RunStoppedError(sealed, message)

    @property
    def sealed(self) -> bool:
        """Whether the run has ended and been sealed."""
        return self._result is not None

    def _require(self) -> LoopResult:
        if self._result is None:
            raise RuntimeError("the stream run has not ended yet: iterate it to the end (or close it) first")
        return self._result

    @property
    def terminal(self) -> str:
        return self._require().terminal

    @property
    def receipt(self) -> Dict[str, Any]:
        return self._require().receipt

    @property
    def receipt_sha256(self) -> str:
        return self._require().receipt_sha256

    @property
    def bundle_json(self) -> str:
        return self._require().bundle_json

    @property
    def bundle(self) -> Dict[str, Any]:
        return self._require().bundle


class StreamRun(_Run):
    """A streamed run (:func:`run_stream`): iterate it once for the consumer's
    :class:`StreamEvent` objects; afterwards ``terminal``, ``receipt``,
    ``bundle`` and ``bundle_json`` describe the sealed run. ``close()`` (or
    leaving a ``with`` block) stops it early."""

    def __init__(self, machine: Machine, adapter: _Streamed) -> None:
        super().__init__(machine, adapter)
        #: The iterator, weakly: a consumer that breaks and drops it closes it.
        self._gen: Optional["weakref.ref[Generator[StreamEvent, None, None]]"] = None
        self._iterated = False

    def __iter__(self) -> Iterator[StreamEvent]:
        if self._iterated:
            raise RuntimeError("a stream run is iterated once")
        self._iterated = True
        gen = self._events()
        self._gen = weakref.ref(gen)
        return gen

    def close(self) -> None:
        """Stop the run early: the provider stream is closed and the in-flight
        attempt recorded as cancelled (nothing happens once the run has ended)."""
        gen = self._gen() if self._gen is not None else None
        if gen is not None:
            gen.close()
        if self._result is None:
            # Never iterated: the run is cancelled before its first attempt.
            self._adapter.leave()
            for _ in self._events():
                pass

    def __enter__(self) -> "StreamRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _events(self) -> Generator[StreamEvent, None, None]:
        a = self._adapter
        a.begin()
        try:
            result = yield from pump_items(run_loop(self._machine, a), a)
        except GeneratorExit:
            # The consumer left: the run went on to its end without it.
            if a.result is not None:
                self._end(a.result)
            raise
        left = a.left
        tail = self._end(result)
        if not left:
            yield from tail
        failure = self._failure()
        if failure is not None:
            raise failure from self._adapter.last_error


class AsyncStreamRun(_Run):
    """A streamed run (:func:`run_stream_async`): ``async for`` over it once for
    the consumer's :class:`StreamEvent` objects; afterwards ``terminal``,
    ``receipt``, ``bundle`` and ``bundle_json`` describe the sealed run.
    ``aclose()`` (or leaving an ``async with`` block) stops it early."""

    def __init__(self, machine: Machine, adapter: _Streamed, on_cancel: Optional[Callable[[RunCancelledError], None]]) -> None:
        super().__init__(machine, adapter)
        self._on_cancel = on_cancel
        #: The iterator (an async generator is closed by ``aclose``, not by dropping it).
        self._gen: Optional[AsyncGenerator[StreamEvent, None]] = None

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        if self._gen is not None:
            raise RuntimeError("a stream run is iterated once")
        self._gen = gen = self._events()
        return gen

    async def aclose(self) -> None:
        """Stop the run early: the provider stream is closed and the in-flight
        attempt recorded as cancelled (nothing happens once the run has ended)."""
        gen = self._gen
        if gen is not None:
            await gen.aclose()
        if self._result is None:
            self._adapter.leave()
            self._gen = None
            async for _ in self._events():
                pass

    async def __aenter__(self) -> "AsyncStreamRun":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _events(self) -> AsyncGenerator[StreamEvent, None]:
        a = self._adapter
        a.begin()
        items = pump_items_async(run_loop(self._machine, a), a)
        try:
            async for ev in items:
                yield ev
        except GeneratorExit:
            # The consumer left: the run goes on to its end without it.
            a.leave()
            async for _ in items:
                pass
            if a.result is not None:
                self._end(a.result)
            raise
        left = a.left
        for ev in self._end(a.result):  # type: ignore[arg-type]
            if not left:
                yield ev
        failure = self._failure()
        if isinstance(failure, RunCancelledError) and self._on_cancel is not None:
            self._on_cancel(failure)
        if failure is not None:
            raise failure from a.last_error


def _start(
    policy: Union[Policy, Document],
    send: Callable[[StreamStep], Any],
    idempotency_key: str,
    reader: Optional[Any],
    options: Dict[str, Any],
    sleep: Callable[[float], Any],
) -> Tuple[Machine, _Streamed]:
    compiled = _checked(policy, idempotency_key, options["key_scope"])
    fleet = _fleet_for(compiled, options["fleet"])
    schedule = _schedule_for(compiled, options["price_schedule"])
    options["fleet"], options["sleep"] = fleet, sleep
    adapter = _Streamed(idempotency_key, send, _TEXT_READER if reader is None else reader, schedule, options)
    adapter.checker = compiled._compiled
    machine_options: Dict[str, Any] = {"origin_epoch_ms": max(0, int(adapter.wall_clock()) - adapter.now_ms()), "stream": True}
    if adapter.fixed:
        machine_options["now_ms"] = adapter.now_ms()
    if schedule is not None:
        machine_options["price_schedule"] = json.loads(schedule)
    # The fleet's conflict bound, token reservation and tenant; the run's own reservation first.
    machine_options.update(fleet_options(fleet))
    if options["reserve_tokens"] is not None:
        machine_options["reserve_tokens"] = options["reserve_tokens"]
    # The core refuses a policy without a stream contract here, before any dispatch.
    return Machine.start(compiled, machine_options), adapter


def run_stream(
    policy: Union[Policy, Document],
    dispatch: Callable[[StreamStep], Iterable[E]],
    idempotency_key: str,
    *,
    reader: Optional[StreamReader[E]] = None,
    classify: Optional[Classifier] = None,
    now: Optional[Callable[[], int]] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    reserve_tokens: Optional[int] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> StreamRun:
    """Stream one logical request under the policy's stream contract.

    ``dispatch(step)`` returns the provider's stream (an iterable of provider
    events that ``reader`` reads; by default ``str`` deltas). Iterating the
    returned :class:`StreamRun` yields the consumer's :class:`StreamEvent`
    objects; a run that does not complete raises :class:`RunStoppedError`
    (or :class:`UnrecognizedDispatchError`) after its last event. The policy,
    key and schedule are checked here, before anything is dispatched; the
    options (``fleet`` too: each attempt admitted before its stream opens) are
    :func:`retryledger.run`'s, and ``now``, the run clock (ms since
    admission), as :func:`retryledger.run_hedged_async` takes it."""
    options = dict(locals())
    machine, adapter = _start(policy, dispatch, idempotency_key, reader, options, sleep or _sleep_ms)
    return StreamRun(machine, adapter)


def run_stream_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[StreamStep], Any],
    idempotency_key: str,
    *,
    reader: Optional[StreamReader[Any]] = None,
    classify: Optional[Classifier] = None,
    now: Optional[Callable[[], int]] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_cancel: Optional[Callable[[RunCancelledError], None]] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    reserve_tokens: Optional[int] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> AsyncStreamRun:
    """The async streaming driver: like :func:`run_stream`; ``dispatch(step)``
    returns an async iterable (or an awaitable of one, or a plain iterable),
    and ``async for`` over the returned :class:`AsyncStreamRun` yields the
    events. Cancelling the consuming task while it waits on the run records
    the cancellation and raises :class:`RunCancelledError` (``on_cancel``
    receives it first)."""
    options = dict(locals())
    machine, adapter = _start(policy, dispatch, idempotency_key, reader, options, sleep or _async_sleep_ms)
    adapter.dispatch = adapter.dispatch_async  # type: ignore[method-assign,assignment]
    return AsyncStreamRun(machine, adapter, on_cancel)
