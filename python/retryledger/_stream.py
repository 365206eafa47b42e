"""The streaming drivers: hosts of the core's stream contract (docs/STREAMING.md).

``run_stream`` and ``run_stream_async`` host the same session as ``run`` and
``run_async`` (same options, same errors), for a ``dispatch(step)`` that
returns the provider's stream (an iterable of provider events; for the async
driver an async iterable, or an awaitable of one). They read each stream,
extract its facts (events, bytes of delta text, the provider's sequence
numbers, response id, terminal and usage events, protocol violations), hand
them to ``session.observe`` with one delta text per provider event, and
yield the consumer's events, :class:`StreamEvent`, exactly as the core logs
them (``retryledger.stream_event.v1``, the sealed bundle's ``stream_events``):

* every provider event is a ``delta`` (``data`` is the provider event,
  ``text`` its delta text, ``""`` for an event without text): ``tentative``
  as it arrives under ``tentative``, ``continuation`` and ``restart``;
  ``committed`` under ``buffer``, delivered only once the run completed;
* in live modes a fresh attempt's events without text (a role chunk,
  ``response.created``, ``message_start``, ``ping``) are held back until its
  first text, then delivered in order before it (or at the end of a stream
  without text): a stream that breaks before any text delivered nothing, so
  its retry is invisible (its facts report no events);
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
``starting_after``, one event or the whole response over the contract's
``max_response_bytes``, a JSON decode error mid-stream, impossible usage),
stops reading, closes the stream and reports the violation; memory stays
bounded by ``max_response_bytes``.

Timeouts (``first_byte_timeout_ms`` until the first provider event,
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
    Generator,
    Awaitable,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Literal,
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
    RunCancelledError,
    RunStoppedError,
    SleepCallback,
    Step,
    TerminalCallback,
    _SYNC_LOOP,
    _Host,
    _call_hook,
    _Sealed,
    _async_sleep_ms,
    _checked,
    _monotonic_ms,
    _schedule_for,
    _sleep_ms,
)
from .fleet import Fleet


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


class StreamStep(Step):
    """A planned streamed attempt: a :class:`Step` with the stream's timing
    and the planned continuation."""

    __slots__ = ("first_byte_timeout_s", "idle_timeout_s")

    first_byte_timeout_s: Optional[float]
    idle_timeout_s: Optional[float]

    @property
    def continuation(self) -> Optional[Dict[str, Any]]:
        """The provider response to resume (``continues_ordinal``,
        ``response_id``, ``starting_after``), or ``None`` for a new request."""
        return self.plan.continuation

    @property
    def timeout_s(self) -> float:
        """The read timeout to give the SDK, seconds: the longer of the
        first-byte and idle timeouts the contract sets, capped by what is left
        of the run's deadline (that alone without either)."""
        left = self.remaining_ms / 1000.0
        limits = [t for t in (self.first_byte_timeout_s, self.idle_timeout_s) if t is not None]
        return min(max(limits), left) if limits else left


# ---- the run objects ---------------------------------------------------------


class _StreamHost(_Host):
    """The session and hooks of a streamed run, recording deltas with each attempt."""

    __slots__ = ()

    def observe(
        self,
        step: Step,
        now: float,
        facts: _core.Facts,
        deltas: Optional[List[str]],
        error: Optional[BaseException],
    ) -> _core.Judgement:
        if error is not None:
            self.last_error = error
        started = step.started_at_ms
        completed = int(now)
        self.judgement = judgement = self.session.observe(
            started, completed if completed > started else started, step._cost, facts, deltas
        )
        if self.fleet is not None:
            self.recorded(step.plan.route_release_sha256, step._tokens, step._rate_limits)
        if self.on_attempt is not None:
            _call_hook("on_attempt", self.on_attempt, self.session.attempts["attempts"][-1], judgement)
        return judgement


#: At most this many events without text are held back before an attempt's first text.
_MAX_HELD = 256


class _Reading:
    """What one attempt's stream said so far (the facts' ``stream`` part)."""

    __slots__ = (
        "deltas",
        "bytes",
        "last_sequence",
        "response_id",
        "terminal",
        "usage",
        "usage_event",
        "violation",
        "buffer",
        "holding",
        "held",
        "ready",
        "ordinal",
    )

    def __init__(self, holding: bool, response_id: Optional[str], ordinal: int) -> None:
        #: The attempt's ordinal.
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
        #: Buffer mode: the events, delivered once the run completes.
        self.buffer: List[Tuple[Any, str]] = []
        #: Live modes, a fresh attempt: events without text are held back until the first text.
        self.holding = holding
        self.held: List[Any] = []
        #: Held events released with the first text, to yield before it.
        self.ready: List[StreamEvent] = []

    def take_ready(self) -> List[StreamEvent]:
        """The released held events, to yield now (emptied)."""
        ready, self.ready = self.ready, []
        return ready

    def drop_held(self) -> None:
        """The attempt ended before its first text: the held events never
        reached the consumer, so nothing was delivered."""
        self.held = []
        self.deltas = []
        self.last_sequence = None
        self.terminal = False
        self.usage_event = False

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


def _with_stream(facts: _core.Facts, reading: _Reading) -> _core.Facts:
    return _Facts(**facts.to_dict(), stream=reading.facts())


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


class _Run(_Sealed):
    """What the sync and async stream runs share: options and the sealed run."""

    _sealed: _core.Sealed
    _core: _Core

    def __init__(self) -> None:
        self._done = False

    def _seal(self) -> None:
        self._sealed = self._core.host.sealed()
        self._done = True

    def _stop(self) -> None:
        """After the iterator was closed: a run that has not ended is cancelled and sealed."""
        if not self._done:
            session = self._core.host.session
            if session.terminal is None:
                session.cancel(0)
            self._seal()

    def _cancel(
        self, step: Optional[StreamStep], reading: Optional[_Reading], exc: BaseException, clock: Callable[[], float], t0: float
    ) -> None:
        """The consumer left (or the task was cancelled): the attempt in flight
        is judged as cancelled, or the run cancelled between attempts; sealed."""
        if step is not None:
            self._core.settle(step, clock() - t0, reading, exc, cancelled=True)
        else:
            session = self._core.host.session
            if session.terminal is None:
                at = int(clock() - t0)
                session.cancel(at if at > 0 else 0)
        self._seal()

    def _finish(self) -> None:
        """After the last attempt: sealed; raises what ``run`` raises when the run did not complete."""
        core = self._core
        failure = core.end()
        if failure is None:
            self._seal()
            return
        self._sealed = failure._sealed
        self._done = True
        raise failure from core.host.last_error

    @property
    def sealed(self) -> bool:
        """Whether the run has ended and been sealed."""
        return self._done

    def _require(self) -> None:
        if not self._done:
            raise RuntimeError("the stream run has not ended yet: iterate it to the end (or close it) first")

    @property
    def terminal(self) -> str:
        self._require()
        return self._sealed.terminal

    @property
    def receipt(self) -> Dict[str, Any]:
        self._require()
        return self._sealed.receipt

    @property
    def receipt_sha256(self) -> str:
        self._require()
        return self._sealed.receipt_sha256

    @property
    def bundle_json(self) -> str:
        self._require()
        return self._sealed.bundle_json

    @property
    def bundle(self) -> Dict[str, Any]:
        self._require()
        return super().bundle


class _Plan:
    """The per-run constants the reading loops use."""

    __slots__ = ("mode", "live", "max_bytes", "first_byte_ms", "idle_ms", "status")

    def __init__(self, compiled: Policy) -> None:
        # A streamed run needs a stream section: the core's rule (invalid_stream_contract otherwise).
        compiled._compiled.require_driver("stream")
        contract = compiled.document["stream"]
        self.mode: str = contract["mode"]
        self.live = self.mode != "buffer"
        self.max_bytes: int = contract["max_response_bytes"]
        self.first_byte_ms: Optional[int] = contract.get("first_byte_timeout_ms")
        self.idle_ms: Optional[int] = contract.get("idle_timeout_ms")
        self.status = "tentative" if self.live else "committed"


def _step(plan: _core.Dispatch, key: str, now: float, schedule: Optional[str], p: _Plan, session: _core.Session) -> StreamStep:
    step = StreamStep(plan, key, int(now) if now > 0 else 0, schedule, session)
    step.first_byte_timeout_s = None if p.first_byte_ms is None else p.first_byte_ms / 1000.0
    step.idle_timeout_s = None if p.idle_ms is None else p.idle_ms / 1000.0
    return step


class _Core:
    """The reading state shared by the sync and async loops for one run."""

    __slots__ = (
        "host",
        "p",
        "reader",
        "schedule",
        "key",
        "sequence",
        "live",
        "max_bytes",
        "r_text",
        "r_sequence",
        "r_response_id",
        "r_is_terminal",
        "r_usage",
        "r_all",
    )

    def __init__(self, host: _StreamHost, p: _Plan, reader: Any, schedule: Optional[str], key: str) -> None:
        self.host = host
        self.p = p
        self.reader = reader
        self.live = p.live
        self.max_bytes = p.max_bytes
        self.r_text: Callable[[Any], str] = reader.text
        self.r_sequence: Callable[[Any], Optional[int]] = reader.sequence
        self.r_response_id: Callable[[Any], Optional[str]] = reader.response_id
        self.r_is_terminal: Callable[[Any], bool] = reader.is_terminal
        self.r_usage: Callable[[Any], Optional[Mapping[str, Any]]] = reader.usage
        self.r_all: Optional[Callable[[Any], Tuple[str, Optional[int], bool, Optional[Mapping[str, Any]]]]] = getattr(
            reader, "read", None
        )
        self.schedule = schedule
        self.key = key
        #: The consumer's sequence: events yielded (or logged) so far.
        self.sequence = 0

    def settle(
        self, step: StreamStep, now: float, reading: Optional[_Reading], error: Optional[BaseException], cancelled: bool = False
    ) -> List[StreamEvent]:
        """Judge the attempt; the events the consumer receives after it."""
        host = self.host
        if reading is not None and reading.held:
            reading.drop_held()
        if reading is not None and reading.usage is not None and reading.violation is None and self.schedule is not None:
            try:
                step.usage(reading.usage)
            except Exception as exc:  # usage the schedule refuses: the attempt ends as an error
                error = exc
        if reading is not None and reading.usage is not None and step._tokens is None:
            # The stream's usage settles the attempt's token reservation (admission limits).
            counts = reading.usage.values()
            step.tokens_used(sum(v for v in counts if isinstance(v, int) and not isinstance(v, bool) and v > 0))
        if error is None and not cancelled:
            facts = _Facts(result="returned") if reading is None else _Facts(result="returned", stream=reading.facts())
        elif reading is not None and reading.violation is not None and not cancelled:
            facts = _Facts(result="raised", error_types=["StreamProtocolError"], stream=reading.facts())
        elif isinstance(error, StreamTimeoutError) and not cancelled:
            part = None if reading is None else reading.facts()
            facts = _Facts(result="raised", error_types=["StreamTimeoutError"], transport_error="timeout", stream=part)
        else:
            assert error is not None
            base = host.facts(step, error, cancelled=cancelled)
            facts = base if reading is None else _with_stream(base, reading)
        judgement = host.observe(step, now, facts, None if reading is None else reading.deltas, None if cancelled else error)
        action = judgement.stream
        ordinal = step.ordinal
        out: List[StreamEvent] = []
        if action == "commit":
            if not self.p.live and reading is not None:
                for data, text in reading.buffer:
                    self.sequence += 1
                    out.append(_event("delta", "committed", ordinal, self.sequence, data, text))
                reading.buffer = []
            self.sequence += 1
            out.append(_event("commit", "committed", ordinal, self.sequence))
        elif action == "invalidate":
            self.sequence += 1
            out.append(_event("invalidate", "invalidated", ordinal, self.sequence))
        return out

    def reading(self, step: StreamStep) -> _Reading:
        """The reading state of a stream that opened: a resumption knows its
        response id; a fresh attempt of a live mode holds back events without
        text until its first text."""
        c = step.plan.continuation
        if c is not None:
            return _Reading(False, c["response_id"], step.plan.ordinal)
        return _Reading(self.p.live, None, step.plan.ordinal)

    def read(self, reading: Optional[_Reading], step: StreamStep, ev: Any) -> Optional[StreamEvent]:
        """Take one provider event: the consumer's event (live modes), or
        ``None`` (buffered, or held back). Raises :class:`StreamProtocolError`
        on a violation (the event is not taken)."""
        assert reading is not None
        r_all = self.r_all
        if r_all is not None:
            text, seq, terminal, units = r_all(ev)
        else:
            text = self.r_text(ev)
            seq = self.r_sequence(ev)
            terminal = self.r_is_terminal(ev)
            units = self.r_usage(ev)
        if type(text) is not str and not isinstance(text, str):
            raise StreamProtocolError("malformed_event", "the reader's delta text is not a str")
        total = self.total(reading, text)
        if seq is not None:
            last = reading.last_sequence
            if last is None:
                c = step.plan.continuation
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
        if reading.response_id is None:
            reading.response_id = self.r_response_id(ev)
        if seq is not None:
            reading.last_sequence = seq
        if terminal:
            reading.terminal = True
        return self.take(reading, step, ev, text, total)

    def read_plain(self, reading: Optional[_Reading], step: StreamStep, ev: Any) -> Optional[StreamEvent]:
        """:meth:`read` for the default reader (``str`` deltas: no sequence
        numbers, id, usage or terminal event to ask about)."""
        assert reading is not None
        if type(ev) is not str:
            raise StreamProtocolError("malformed_event", f"expected a str delta, got {type(ev).__name__}")
        return self.take(reading, step, ev, ev, self.total(reading, ev))

    def total(self, reading: _Reading, text: str) -> int:
        """The attempt's bytes with ``text``; raises :class:`StreamProtocolError`
        when the event or the response is over ``max_response_bytes``."""
        n = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        limit = self.max_bytes
        if n > limit:
            raise StreamProtocolError("event_too_large", f"one event of {n} bytes over max_response_bytes {limit}")
        total = reading.bytes + n
        if total > limit:
            raise StreamProtocolError("response_too_large", f"over max_response_bytes {limit}")
        return total

    def take(self, reading: _Reading, step: StreamStep, ev: Any, text: str, total: int) -> Optional[StreamEvent]:
        """Record a checked event's delta: the consumer's event (live modes),
        or ``None`` (buffered, or held back)."""
        reading.bytes = total
        reading.deltas.append(text)
        if self.live:
            if reading.holding:
                if not text and len(reading.held) < _MAX_HELD:
                    reading.held.append(ev)
                    return None
                self.release(reading, step)
            self.sequence = sequence = self.sequence + 1
            out = _new(StreamEvent)
            _kind_slot(out, "delta")
            _status_slot(out, "tentative")
            _attempt_slot(out, reading.ordinal)
            _sequence_slot(out, sequence)
            _data_slot(out, ev)
            _text_slot(out, text)
            return out
        reading.buffer.append((ev, text))
        return None

    def release(self, reading: _Reading, step: StreamStep) -> None:
        """Deliver the held events (into ``reading.ready``, in order)."""
        reading.holding = False
        ordinal = step.plan.ordinal
        for ev in reading.held:
            self.sequence += 1
            reading.ready.append(_event("delta", "tentative", ordinal, self.sequence, ev, ""))
        reading.held = []

    def ended(self, reading: _Reading, step: StreamStep) -> List[StreamEvent]:
        """The iteration ended normally: the held events, delivered now."""
        if getattr(self.reader, "terminal_at_end", False):
            reading.terminal = True
        if reading.held:
            self.release(reading, step)
        return reading.take_ready()

    def opened(
        self, step: StreamStep
    ) -> Tuple[_Reading, Callable[[Optional[_Reading], StreamStep, Any], Optional[StreamEvent]], float, float]:
        """A stream opened: its reading state, the read function for the
        reader, the deadline and when the wait for the first event expires
        (run clock, ms)."""
        t_deadline = float(step.plan.deadline_ms)
        return (
            self.reading(step),
            self.read_plain if self.reader is _TEXT_READER else self.read,
            t_deadline,
            _limit_ms(self.p, True, float(step.started_at_ms), t_deadline),
        )

    def failed(self, reading: _Reading, exc: Exception) -> Exception:
        """Reading the stream raised ``exc``: a protocol violation (the
        host's, or a JSON decode error along its chain) is noted in the
        reading; ``exc`` is the attempt's error."""
        if isinstance(exc, StreamProtocolError):
            reading.violation = exc.violation
        elif _is_malformed(exc):
            reading.violation = "malformed_event"
        return exc

    def end(self) -> Union[None, RunStoppedError]:
        """After the last attempt: ``None`` when the run completed, else the error to raise."""
        session = self.host.session
        if session.terminal == "completed":
            return None
        return self.host.failure()


def _limit_ms(p: _Plan, first: bool, since: float, t_deadline: float) -> float:
    """When (run clock, ms) a wait for an event that began at ``since`` expires."""
    limit = p.first_byte_ms if first else p.idle_ms
    if limit is None:
        return t_deadline
    until = since + limit
    return until if until < t_deadline else t_deadline


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


def _late(core: _Core, now: float, until: float, t_deadline: float, ev: Any) -> bool:
    """An event that came after its wait expired (a terminal event after the
    deadline alone is taken: the core judges a late success)."""
    if now <= until:
        return False
    if until >= t_deadline and core.reader.is_terminal(ev):
        return False
    return True


class StreamRun(_Run):
    """A streamed run (:func:`run_stream`): iterate it once for the consumer's
    :class:`StreamEvent` objects; afterwards ``terminal``, ``receipt``,
    ``bundle`` and ``bundle_json`` describe the sealed run. ``close()`` (or
    leaving a ``with`` block) stops it early."""

    def __init__(
        self,
        core: _Core,
        dispatch: Callable[[StreamStep], Iterable[Any]],
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        super().__init__()
        self._core = core
        self._dispatch = dispatch
        self._clock = clock
        self._sleep = sleep
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
        self._stop()

    def __enter__(self) -> "StreamRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _events(self) -> Generator[StreamEvent, None, None]:
        core = self._core
        host = core.host
        clock = self._clock
        sleep = self._sleep
        t0 = clock()
        step: Optional[StreamStep] = None
        stream: Any = None
        reading: Optional[_Reading] = None
        try:
            while True:
                plan, now = _SYNC_LOOP.next_attempt(host, clock, t0, sleep)
                if isinstance(plan, _Terminal):
                    break
                step = _step(plan, core.key, now, core.schedule, core.p, core.host.session)
                reading = None
                error: Optional[BaseException] = None
                try:
                    stream = self._dispatch(step)
                    it = iter(stream)
                except Exception as exc:
                    error = exc
                if error is None:
                    reading, read, t_deadline, until = core.opened(step)
                    idle = core.p.idle_ms
                    try:
                        for ev in it:
                            now = clock() - t0
                            if now > until and _late(core, now, until, t_deadline, ev):
                                raise StreamTimeoutError("no stream event within the first-byte or idle timeout")
                            out = read(reading, step, ev)
                            if out is not None:
                                if reading.ready:
                                    yield from reading.take_ready()
                                yield out
                            if idle is not None:
                                # The wait for the next event starts when the consumer is done.
                                until = clock() - t0 + idle
                                if until > t_deadline:
                                    until = t_deadline
                            elif until != t_deadline:
                                until = t_deadline
                        yield from core.ended(reading, step)
                    except Exception as exc:
                        error = core.failed(reading, exc)
                        _close(stream)
                    stream = None
                done, step = step, None
                events = core.settle(done, clock() - t0, reading, error)
                reading = None
                for out in events:
                    yield out
        except GeneratorExit:
            if self._done:
                raise
            if stream is not None:
                _close(stream)
            self._cancel(step, reading, GeneratorExit(), clock, t0)
            raise
        self._finish()


class _Watchdog:
    """One timer per attempt on the event loop, re-armed lazily: it cancels the
    reading task only when a wait for the provider really lasted the limit."""

    __slots__ = ("loop", "task", "first_s", "idle_s", "deadline", "since", "waiting", "first", "fired", "handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: "asyncio.Task[Any]", p: _Plan, deadline: float) -> None:
        self.loop = loop
        self.task = task
        self.first_s = None if p.first_byte_ms is None else p.first_byte_ms / 1000.0
        self.idle_s = None if p.idle_ms is None else p.idle_ms / 1000.0
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


class AsyncStreamRun(_Run):
    """A streamed run (:func:`run_stream_async`): ``async for`` over it once for
    the consumer's :class:`StreamEvent` objects; afterwards ``terminal``,
    ``receipt``, ``bundle`` and ``bundle_json`` describe the sealed run.
    ``aclose()`` (or leaving an ``async with`` block) stops it early."""

    def __init__(
        self,
        core: _Core,
        dispatch: Callable[[StreamStep], Any],
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        on_cancel: Optional[Callable[[RunCancelledError], None]],
    ) -> None:
        super().__init__()
        self._core = core
        self._dispatch = dispatch
        self._clock = clock
        self._sleep = sleep
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
        self._stop()

    async def __aenter__(self) -> "AsyncStreamRun":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _events(self) -> AsyncGenerator[StreamEvent, None]:
        core = self._core
        host = core.host
        clock = self._clock
        loop = asyncio.get_running_loop()
        t0 = clock()
        step: Optional[StreamStep] = None
        stream: Any = None
        reading: Optional[_Reading] = None
        dog: Optional[_Watchdog] = None
        try:
            while True:
                plan, now = await host.next_attempt_async(clock, t0, self._sleep)
                if isinstance(plan, _Terminal):
                    break
                step = _step(plan, core.key, now, core.schedule, core.p, core.host.session)
                reading = None
                error: Optional[BaseException] = None
                task = asyncio.current_task()
                assert task is not None
                dog = _Watchdog(loop, task, core.p, loop.time() + (plan.deadline_ms - now) / 1000.0)
                try:
                    try:
                        opened = self._dispatch(step)
                        if inspect.isawaitable(opened):
                            opened = await opened
                        stream = opened
                        if hasattr(stream, "__aiter__"):
                            ait = stream.__aiter__()
                            anext_ = ait.__anext__
                            sync_it = None
                        else:
                            sync_it = iter(stream)
                    except asyncio.CancelledError:
                        if not dog.fired:
                            raise
                        _uncancel(task)
                        error = StreamTimeoutError("the stream did not open within the first-byte timeout")
                    except Exception as exc:
                        error = exc
                    if error is None:
                        reading, read, t_deadline, until = core.opened(step)
                        idle = core.p.idle_ms
                        try:
                            while True:
                                dog.since = loop.time()
                                dog.waiting = True
                                if sync_it is None:
                                    try:
                                        ev = await anext_()
                                    except StopAsyncIteration:
                                        break
                                else:
                                    try:
                                        ev = next(sync_it)
                                    except StopIteration:
                                        break
                                dog.waiting = False
                                if dog.first:
                                    dog.first_event()
                                if sync_it is not None:
                                    # A blocking iterable: the timer cannot interrupt it; check after the event.
                                    now = clock() - t0
                                    if now > until and _late(core, now, until, t_deadline, ev):
                                        raise StreamTimeoutError("no stream event within the first-byte or idle timeout")
                                out = read(reading, step, ev)
                                if out is not None:
                                    if reading.ready:
                                        for held in reading.take_ready():
                                            yield held
                                    yield out
                                if sync_it is not None:
                                    now = clock() - t0
                                    until = t_deadline if idle is None else min(now + idle, t_deadline)
                            dog.waiting = False
                            for held in core.ended(reading, step):
                                yield held
                        except asyncio.CancelledError:
                            if not dog.fired:
                                raise
                            _uncancel(task)
                            error = StreamTimeoutError("no stream event within the first-byte or idle timeout")
                            await _aclose(stream)
                        except Exception as exc:
                            error = core.failed(reading, exc)
                            await _aclose(stream)
                        stream = None
                finally:
                    dog.stop()
                done, step = step, None
                events = core.settle(done, clock() - t0, reading, error)
                reading = None
                for out in events:
                    yield out
        except GeneratorExit:
            if dog is not None:
                dog.stop()
            if self._done:
                raise
            if stream is not None:
                await _aclose(stream)
            self._cancel(step, reading, GeneratorExit(), clock, t0)
            raise
        except asyncio.CancelledError as cancelled:
            if stream is not None:
                await _aclose(stream)
            self._cancel(step, reading, cancelled, clock, t0)
            error_ = RunCancelledError(self._sealed)
            if self._on_cancel is not None:
                self._on_cancel(error_)
            raise error_ from cancelled
        self._finish()


def _prepare(
    policy: Union[Policy, Document],
    idempotency_key: str,
    reader: Optional[Any],
    classify: Optional[Classifier],
    wall_clock: Optional[Callable[[], float]],
    on_attempt: Optional[AttemptCallback],
    key_scope: Optional[Tuple[str, str]],
    price_schedule: Optional[Document],
    fleet: Optional[Fleet] = None,
    reserve_tokens: Optional[int] = None,
    hooks: Tuple[Optional[DecisionCallback], Optional[SleepCallback], Optional[TerminalCallback]] = (None, None, None),
) -> _Core:
    compiled = _checked(policy, idempotency_key, key_scope)
    p = _Plan(compiled)
    schedule = _schedule_for(compiled, price_schedule)
    host = _StreamHost(compiled, classify, wall_clock, on_attempt, fleet, reserve_tokens, hooks)
    if schedule is not None:
        host.session.set_price_schedule(schedule)
    return _Core(host, p, _TEXT_READER if reader is None else reader, schedule, idempotency_key)


def run_stream(
    policy: Union[Policy, Document],
    dispatch: Callable[[StreamStep], Iterable[E]],
    idempotency_key: str,
    *,
    reader: Optional[StreamReader[E]] = None,
    classify: Optional[Classifier] = None,
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
    :func:`retryledger.run`'s."""
    core = _prepare(
        policy, idempotency_key, reader, classify, wall_clock, on_attempt, key_scope, price_schedule, fleet, reserve_tokens,
        (on_decision, on_sleep, on_terminal),
    )
    return StreamRun(core, dispatch, clock or _monotonic_ms, sleep or _sleep_ms)


def run_stream_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[StreamStep], Any],
    idempotency_key: str,
    *,
    reader: Optional[StreamReader[Any]] = None,
    classify: Optional[Classifier] = None,
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
    core = _prepare(
        policy, idempotency_key, reader, classify, wall_clock, on_attempt, key_scope, price_schedule, fleet, reserve_tokens,
        (on_decision, on_sleep, on_terminal),
    )
    return AsyncStreamRun(core, dispatch, clock or _monotonic_ms, sleep or _async_sleep_ms, on_cancel)
