"""The drivers: hosts of the core's Session for one logical request.

``run`` and ``run_async`` do the I/O and nothing else: they ask the session
what to dispatch next and not before when, sleep until then, call
``dispatch(step)`` exactly once per planned attempt, extract plain facts from
what it returned or raised, and hand them to ``session.observe``, where the
core judges them (docs/HOSTS.md: the rules and the tables) and records the
attempt. The sealed run (policy, attempts, receipt) comes back with the value
or on the error. Conventions, the same as the TypeScript driver's:

* The run clock is milliseconds since the driver started. ``clock`` returns
  milliseconds on any monotonic origin and ``sleep`` takes milliseconds (both
  injectable); the driver sleeps until ``not_before_ms`` and makes no sleep
  call when there is nothing to wait for. ``wall_clock`` is Unix ms (default
  ``time.time() * 1000``), read to resolve HTTP-date Retry-After hints.
* ``step`` carries the planned ``Dispatch`` (``step.plan``) and its
  ``ordinal``, ``route_id``, ``route_ordinal``, ``route_release_sha256``,
  ``deadline_ms``, ``reserve_cost``, the raw ``idempotency_key`` (its SHA-256
  must equal the policy's ``idempotency_key_sha256``, checked before the
  first dispatch), ``started_at_ms`` and ``remaining_ms`` until the deadline.
  ``step.charge(cost)`` records the attempt's actual cost (an attempt never
  charged costs its ``reserve_cost``); ``step.output_delivered()`` says that
  response bytes reached the caller (a failure after it is never retried).
* ``price_schedule`` (a ``retryledger.price_schedule.v1`` document) is
  checked against the policy before the first dispatch
  (:func:`retryledger.check_price_schedule`: the same cost unit, every route
  release priced; a coded :class:`PolicyError` and nothing dispatched
  otherwise). ``step.usage({"input": 812, "output": 96})`` then charges what
  that usage costs on the step's ``route_release_sha256``
  (:func:`retryledger.price_cost`), added like ``charge``. An attempt whose
  usage is never reported keeps its reservation. Usage the core refuses (a
  kind the release does not price, a negative or fractional count) raises
  its coded error from ``step.usage``; raised out of ``dispatch`` it ends
  the run as any unrecognized error does. ``step.usage`` in a run without a
  schedule raises :class:`PolicyError` ``price_schedule_missing_release``.
* The facts of a raised exception (:func:`facts_of`): the outcome it carries
  (:class:`AttemptError`) or the ``classify`` hook's answer; the class names
  along ``type(exc).__mro__`` and its ``__cause__`` chain; string ``code``
  attributes and ``errno`` names along the chain; its HTTP status
  (``status``, ``status_code``, ``statusCode``, ``response.status``,
  ``response.status_code``), the headers the core reads (``READ_HEADERS``:
  Retry-After and rate-limit headers) of ``headers`` or ``response.headers``,
  and for an error status the response body (``response.text`` of a read
  response, else the error's ``body``; docs/PROVIDERS.md). An error no rule recognizes is recorded as
  indeterminate ``unknown_provider_acceptance`` (never retried) and raised as
  :class:`UnrecognizedDispatchError` whose ``__cause__`` is the exception.
* A run that ends without success raises :class:`RunStoppedError` (``code``
  is the terminal) carrying the sealed run. Cancelling ``run_async``'s task
  records the cancellation (``cancelled_at_ms`` between attempts; during a
  dispatch that attempt is judged with ``cancelled``) and raises
  :class:`RunCancelledError`, a subclass of ``asyncio.CancelledError``.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import hashlib
import json
import math
import time
import warnings
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Generic,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import _core
from ._api import (
    Document,
    Policy,
    _policy_of,
    call,
    check_integer,
    check_price_schedule,
    idempotency_key_sha256,
    price_cost,
    to_text,
)
from ._errors import DecodeError, DriftError, HookWarning, PolicyError, RetryledgerError
from .fleet import Fleet
from ._tables import (
    MAX_ERROR_BODY_BYTES,
    MAX_ERROR_NAME_BYTES as _MAX_NAME_BYTES,
    MAX_ERROR_NAMES as _MAX_NAMES,
    READ_HEADERS,
    RETRYABLE_KINDS,
    IndeterminateKind,
    NonRetryableKind,
    RetryableKind,
)

__all__ = [
    "AttemptError",
    "Step",
    "RunResult",
    "RunStoppedError",
    "UnrecognizedDispatchError",
    "RunCancelledError",
    "Classifier",
    "AttemptCallback",
    "DecisionCallback",
    "SleepCallback",
    "TerminalCallback",
    "facts_of",
    "run",
    "run_async",
]

T = TypeVar("T")

#: A classifier maps an exception to an outcome (an ``Outcome``, a mapping or
#: JSON text), or ``None`` to leave it to the core's rules.
Classifier = Callable[[BaseException], Union[_core.Outcome, Mapping[str, Any], str, None]]

#: Called after each recorded attempt with the attempt (as in the attempts
#: document) and the core's judgement.
AttemptCallback = Callable[[Dict[str, Any], _core.Judgement], None]

#: Called with each decision of the core as a plain dict (``kind``
#: ``dispatch`` with the planned attempt, or ``terminal``).
DecisionCallback = Callable[[Dict[str, Any]], None]

#: Called before the driver waits for a planned attempt's ``not_before_ms``,
#: with ``{ordinal, route_id, at_ms, not_before_ms, sleep_ms}`` (run clock, ms).
SleepCallback = Callable[[Dict[str, Any]], None]

#: Called once with the sealed receipt (a plain dict) when the run ends, on
#: success, stop or cancellation alike.
TerminalCallback = Callable[[Dict[str, Any]], None]


def _call_hook(name: str, hook: Callable[..., Any], *args: Any) -> None:
    """Call a run hook; what it raises is reported as a :class:`HookWarning`
    (code ``hook_failed``) and never reaches the run."""
    try:
        hook(*args)
    except Exception as exc:  # a hook never changes a decision or the receipt
        warnings.warn(HookWarning(name, exc), stacklevel=3)

_Terminal = _core.Terminal
_Facts = _core.Facts

#: The facts of a dispatch that returned.
_RETURNED = _Facts(result="returned")

#: The facts of a returned answer whose output checks broke (a check raised,
#: or its verdict is not one): unrecognized, never retried.
_CHECK_BROKE = _Facts(result="raised", error_types=["OutputCheckError"])

_READ = frozenset(READ_HEADERS)

# ---- explicit outcomes --------------------------------------------------------

#: Outcome text -> (outcome, facts of an error carrying it), bounded.
_EXPLICIT: Dict[str, Tuple[_core.Outcome, _core.Facts]] = {}
_RETRYABLE_TEXT = {k: f'{{"class":"retryable","kind":"{k}"}}' for k in RETRYABLE_KINDS}


def _explicit(outcome: Union[_core.Outcome, Mapping[str, Any], str]) -> Tuple[_core.Outcome, _core.Facts]:
    """An outcome decoded strictly by the core and the facts of an error carrying
    it, once per distinct text (a small cache)."""
    key = outcome if isinstance(outcome, str) else None
    if key is not None:
        hit = _EXPLICIT.get(key)
        if hit is not None:
            return hit
    decoded = outcome if isinstance(outcome, _core.Outcome) else _core.Outcome(outcome)
    canonical = decoded.json
    hit = _EXPLICIT.get(canonical)
    if hit is None:
        hit = (decoded, _Facts(result="raised", outcome=decoded))
        if len(_EXPLICIT) < 256:
            _EXPLICIT[canonical] = hit
    if key is not None and len(_EXPLICIT) < 256:
        _EXPLICIT[key] = hit
    return hit


_SUCCESS = _explicit('{"class":"success"}')


class AttemptError(Exception):
    """Raise from ``dispatch`` to say how an attempt failed.

    ``outcome`` is an outcome document, e.g. ``{"class": "retryable", "kind":
    "rate_limited", "retry_after_ms": 250}`` (a mapping, JSON text or an
    ``Outcome``); the core checks it at construction (:class:`DecodeError` if
    malformed) and judges the attempt by it (rule ``explicit``). ``args`` are
    the constructor's arguments.
    """

    # Slots for the two fields every instance has: no instance dict is made
    # for them (one per raise otherwise); other attributes still go to one.
    __slots__ = ("_outcome", "_facts")

    _outcome: _core.Outcome
    _facts: _core.Facts

    def __init__(self, outcome: Union[_core.Outcome, Mapping[str, Any], str], message: Optional[str] = None) -> None:
        # BaseException.__new__ has set ``args``; no other state is needed.
        try:
            hit = _EXPLICIT.get(outcome)  # type: ignore[arg-type]
        except TypeError:  # a mapping
            hit = None
        if hit is None:
            hit = _explicit(outcome)
        if hit is _SUCCESS:
            raise DecodeError("invalid_value", "an AttemptError carries a failure, not success", "/class")
        self._outcome, self._facts = hit

    def __str__(self) -> str:
        args = self.args
        if len(args) > 1 and args[1] is not None:
            return str(args[1])
        return self.outcome_json

    def __repr__(self) -> str:
        return f"AttemptError({self.outcome_json!r})"

    @property
    def outcome_json(self) -> str:
        """The outcome as canonical JSON."""
        return self._outcome.json

    @property
    def outcome(self) -> Dict[str, Any]:
        """The outcome as a plain dict."""
        return self._outcome.to_dict()

    @classmethod
    def retryable(
        cls, kind: RetryableKind, retry_after_ms: Optional[int] = None, message: Optional[str] = None
    ) -> "AttemptError":
        """A retryable failure: ``timeout_before_response``, ``rate_limited``, ``unavailable`` or ``in_progress``."""
        if retry_after_ms is None:
            if message is None and cls is AttemptError:
                known = _RETRYABLE_ERRORS.get(kind)
                if known is not None:
                    # What ``cls(text)`` makes, without running ``__init__``'s lookups again.
                    error = _new_exception(cls, known[0])
                    error._outcome, error._facts = known[1]
                    return error
            text = _RETRYABLE_TEXT.get(kind)
            if text is None:
                text = f'{{"class":"retryable","kind":{json.dumps(kind)}}}'
            return cls(text) if message is None else cls(text, message)
        hint = check_integer("retry_after_ms", retry_after_ms)
        return cls(f'{{"class":"retryable","kind":{json.dumps(kind)},"retry_after_ms":{hint}}}', message)

    @classmethod
    def non_retryable(cls, kind: NonRetryableKind, message: Optional[str] = None) -> "AttemptError":
        """A failure no other attempt repairs (``rejected``, ``invalid_request``, ...)."""
        return cls(f'{{"class":"non_retryable","kind":{json.dumps(kind)}}}', message)

    @classmethod
    def indeterminate(cls, kind: IndeterminateKind, message: Optional[str] = None) -> "AttemptError":
        """An outcome to reconcile, never retried (``unknown_provider_acceptance``, ...)."""
        return cls(f'{{"class":"indeterminate","kind":{json.dumps(kind)}}}', message)


#: Per retryable kind: the outcome text and its (outcome, facts), for ``AttemptError.retryable``.
_RETRYABLE_ERRORS = {k: (t, _explicit(t)) for k, t in _RETRYABLE_TEXT.items()}
_new_exception = BaseException.__new__


# ---- the step ---------------------------------------------------------------


def _charge_with_usage() -> PolicyError:
    return PolicyError(
        "charge_with_usage",
        "an attempt's cost is either charged by hand or priced from its usage, not both",
        "/cost",
    )


class Step:
    """One planned attempt, as ``dispatch`` receives it."""

    # The fields every attempt sets are slots; the ones an attempt rarely
    # reports keep their defaults on the class until set (in the instance's
    # dict, made only then), so making a step costs five stores.
    __slots__ = ("plan", "idempotency_key", "started_at_ms", "_schedule", "_session", "__dict__")

    plan: _core.Dispatch
    idempotency_key: str
    started_at_ms: int
    _schedule: Optional[str]
    _session: Optional[_core.Session]
    _cost: Optional[int] = None
    _delivered: bool = False
    _usage: bool = False
    _tokens: Optional[int] = None
    _rate_limits: Optional[List[Tuple[str, str]]] = None
    #: Under repair: the logical request this run sends (``None`` on the
    #: root run unless ``request=`` was given), and its repair ordinal (0 on the root).
    request: Any = None
    repair_ordinal: int = 0
    #: A call this attempt refused to send (``request_drift``): the driver
    #: raises it whatever the SDK wrapped it in.
    _refused: Optional[RetryledgerError] = None

    def __init__(
        self,
        plan: _core.Dispatch,
        idempotency_key: str,
        started_at_ms: int,
        price_schedule: Optional[str] = None,
        session: Optional[_core.Session] = None,
    ) -> None:
        #: The planned dispatch (every field of the core's decision).
        self.plan = plan
        #: The raw idempotency key; send it with every attempt.
        self.idempotency_key = idempotency_key
        #: When the attempt started on the run clock, ms.
        self.started_at_ms = started_at_ms
        #: The run's price schedule as JSON text, checked against the policy.
        self._schedule = price_schedule
        #: The run's session, which records usage and request bodies.
        self._session = session

    @property
    def ordinal(self) -> int:
        """Global ordinal of the attempt, from 1."""
        return self.plan.ordinal

    @property
    def route_id(self) -> str:
        """The route to dispatch to."""
        return self.plan.route_id

    @property
    def route_ordinal(self) -> int:
        """Ordinal on the route, from 1."""
        return self.plan.route_ordinal

    @property
    def route_release_sha256(self) -> str:
        """The exact route release the policy names."""
        return self.plan.route_release_sha256

    @property
    def deadline_ms(self) -> int:
        """The run's deadline on the run clock, ms."""
        return self.plan.deadline_ms

    @property
    def reserve_cost(self) -> int:
        """Worst-case cost reserved for this attempt."""
        return self.plan.reserve_cost

    @property
    def remaining_ms(self) -> int:
        """Milliseconds left until the run's deadline when the attempt started."""
        left = self.plan.deadline_ms - self.started_at_ms
        return left if left > 0 else 0

    def charge(self, cost: int) -> None:
        """Record actual cost of this attempt (adds up when called more than once).

        An attempt's cost is either charged or priced from its usage: after
        :meth:`usage` this raises :class:`PolicyError` ``charge_with_usage``."""
        if self._usage:
            raise _charge_with_usage()
        cost = check_integer("cost", cost)
        self._cost = check_integer("cost", cost + (self._cost or 0))

    def tokens_used(self, tokens: int) -> None:
        """Report the tokens this attempt used (reports add up), for a policy
        whose admission limits have a token bucket: when the attempt's
        admission slot is released its reservation is settled with them
        (unused tokens go back to the bucket, more than reserved are taken
        from it). Without a report the reservation stands."""
        tokens = check_integer("tokens", tokens)
        self._tokens = check_integer("tokens", tokens + (self._tokens or 0))

    def rate_limit_headers(self, headers: Any) -> None:
        """Record the rate-limit headers of this attempt's response (success
        or failure): an ``httpx`` response, a headers mapping, ``(name,
        value)`` pairs, or anything with ``headers`` / ``response.headers``.
        Under admission limits the release after the attempt applies them to
        the route's buckets in the core (a lower ``remaining`` lowers a
        bucket; an exhausted one with a reset empties it until the reset, for
        every run of the fleet). The integrations record them for you (the
        ``httpx`` hook); a failure's headers are read from the error otherwise."""
        pairs = rate_limit_headers_of(headers)
        if pairs:
            self._rate_limits = pairs

    def usage(self, units: Mapping[str, int]) -> None:
        """Record raw usage: ``units`` (kind -> count, e.g. ``{"input": 812,
        "output": 96}``; reports add up). The attempt records it, and its cost
        is what that usage costs on this step's route release under the run's
        price schedule, priced by the core. After :meth:`charge` this raises
        :class:`PolicyError` ``charge_with_usage`` (a cost is one or the other).

        Raises the core's coded error for usage it refuses (``usage_unpriced``,
        ``integer_out_of_range``, ``float_value``, ``arithmetic_overflow``, ...)
        and :class:`PolicyError` ``price_schedule_missing_release`` when the run
        has no price schedule; nothing is recorded then.
        """
        schedule = self._schedule
        if schedule is None:
            raise PolicyError(
                "price_schedule_missing_release",
                "the run has no price schedule: pass price_schedule= to the driver to charge usage",
                "/price_schedule",
            )
        if self._cost is not None:
            raise _charge_with_usage()
        session = self._session
        if session is None:  # a step built by hand, outside a driver
            self.charge(price_cost(schedule, self.plan.route_release_sha256, dict(units)))
            return
        call(session.add_usage, to_text(dict(units)))
        self._usage = True

    def request_body(self, body: Union[bytes, bytearray, memoryview, str]) -> None:
        """Record the request body this attempt sent, after lowering to its
        route (bytes, or a string's UTF-8 bytes): the attempt records its
        SHA-256, and every retry on the same route must send the same body
        (replay: ``request_body_drift``). The httpx, openai and anthropic
        integrations call it for you."""
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        session = self._session
        if session is not None:
            call(session.set_request_body_sha256, hashlib.sha256(data).hexdigest())

    def request_body_digest(self, sha256: str) -> None:
        """Record the SHA-256 (lowercase hex) of the request body this
        attempt sent, computed elsewhere: a lowered request's
        ``body_sha256`` (:func:`retryledger.lower_request`), the digest of
        its RFC 8785 form. Like :meth:`request_body`, every retry on the
        route must send the same body."""
        session = self._session
        if session is not None:
            call(session.set_request_body_sha256, sha256)

    def set_model(self, requested: Optional[str] = None, served: Optional[str] = None) -> None:
        """Record which model this attempt asked for (``requested``: the
        lowered request's model) and which the provider's answer named
        (``served``); the receipt's schedule names both (docs/LOWERING.md).
        A side not known is ``None``: recorded as unknown, never invented;
        a ``served`` name the receipt cannot hold (not an identifier) is
        recorded as unknown too. The cross-provider driver
        (:mod:`retryledger.providers`) calls it for you."""
        session = self._session
        if session is not None:
            call(session.set_model, requested, served)

    def check_sent(self, url_path: str, body: Union[bytes, bytearray, memoryview, str]) -> None:
        """Check an SDK call this attempt is about to send (its URL path and
        JSON body) against the logical request the policy's template bound;
        a call that lifts to another request raises :class:`DriftError`
        ``request_drift`` before it is sent, and the run stops with it
        (nothing sent). The openai, anthropic and httpx integrations and
        ``@retry(..., clients=...)`` call it for you."""
        session = self._session
        if session is None:
            return
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        try:
            call(session.check_sent, url_path, data)
        except RetryledgerError as refused:
            self._refused = refused
            raise

    @property
    def price_schedule(self) -> Optional[str]:
        """The run's price schedule as JSON text, or ``None`` when the run has none."""
        return self._schedule

    def output_delivered(self) -> None:
        """Response bytes reached the caller: a failure after this is never retried."""
        self._delivered = True

    def job(self, id: Optional[str], status: Optional[str]) -> None:
        """For an async job (docs/JOBS.md): the provider's job id this attempt
        was answered with or asked about (the core keeps only its SHA-256)
        and the job status the answer reported. :func:`retryledger.job.run_job`
        calls it for you."""
        session = self._session
        if session is not None:
            call(session.set_job, id, status)

    def reconciled(self, answer: str) -> None:
        """For an async job: the receiver's answer when the attempt was
        reconciled by idempotency key after its answer was lost
        (``succeeded``, ``failed_no_effect``, ``unknown``); the attempt's
        outcome is the answer's."""
        session = self._session
        if session is not None:
            call(session.set_reconciled, answer)

    @property
    def cost(self) -> int:
        """The cost recorded for this attempt: what was charged, else ``reserve_cost``."""
        return self.plan.reserve_cost if self._cost is None else self._cost

    def __repr__(self) -> str:
        return (
            f"Step(ordinal={self.ordinal}, route_id={self.route_id!r}, "
            f"route_ordinal={self.route_ordinal}, remaining_ms={self.remaining_ms}, "
            f"reserve_cost={self.reserve_cost})"
        )


class _Plan:
    """A planned dispatch as the run machine's ``dispatch`` effect names it,
    with the attributes of :class:`_core.Dispatch` a step reads."""

    def __init__(self, dispatch: Mapping[str, Any]) -> None:
        self.__dict__.update(dispatch)
        self.kind = "dispatch"

    def __getattr__(self, name: str) -> Any:
        # The optional fields the effect omits (jitter, continuation, job).
        return None


class MachineStep(Step):
    """The :class:`Step` of an attempt the run machine planned: what the
    attempt reports (cost, usage, request body) goes into the ``observed``
    event the host loop answers with (:meth:`observation`)."""

    _units: Optional[Dict[str, int]] = None
    _body_sha256: Optional[str] = None
    _model: Optional[Dict[str, str]] = None
    #: The compiled policy whose bound request :meth:`check_sent` checks a call against.
    _compiled: Optional[_core.Compiled] = None

    def __init__(self, effect: Mapping[str, Any], idempotency_key: str, price_schedule: Optional[str] = None) -> None:
        super().__init__(_Plan(effect["dispatch"]), idempotency_key, int(effect["started_at_ms"]), price_schedule, None)  # type: ignore[arg-type]

    def usage(self, units: Mapping[str, int]) -> None:
        schedule = self._schedule
        if schedule is None:
            raise PolicyError(
                "price_schedule_missing_release",
                "the run has no price schedule: pass price_schedule= to the driver to charge usage",
                "/price_schedule",
            )
        if self._cost is not None:
            raise _charge_with_usage()
        merged = dict(self._units or {})
        for kind, n in dict(units).items():
            merged[kind] = merged.get(kind, 0) + n if isinstance(n, int) and not isinstance(n, bool) else n
        # The core prices it now: usage it refuses raises here, nothing recorded.
        price_cost(schedule, self.plan.route_release_sha256, merged)
        self._units = merged
        self._usage = True

    def request_body(self, body: Union[bytes, bytearray, memoryview, str]) -> None:
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        self._body_sha256 = hashlib.sha256(data).hexdigest()

    def request_body_digest(self, sha256: str) -> None:
        self._body_sha256 = sha256

    def check_sent(self, url_path: str, body: Union[bytes, bytearray, memoryview, str]) -> None:
        compiled = self._compiled
        if compiled is None:
            return
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        try:
            call(compiled.check_sent, url_path, data)
        except RetryledgerError as refused:
            self._refused = refused
            raise

    def set_model(self, requested: Optional[str] = None, served: Optional[str] = None) -> None:
        # A requested name that is not an identifier is the core's coded
        # error; a served one is recorded as unknown.
        call(_core.check_model, requested, None)
        if served is not None:
            try:
                call(_core.check_model, None, served)
            except RetryledgerError:
                served = None
        model = {}
        if requested is not None:
            model["requested"] = requested
        if served is not None:
            model["served"] = served
        self._model = model or None

    def observation(
        self, ok: bool, reply: Any, classify: Optional[Classifier], now_unix_ms: int
    ) -> Dict[str, Any]:
        """The ``observed`` event's fields but ``kind`` and ``completed_at_ms``."""
        fields: Dict[str, Any] = {}
        if not ok:
            if type(reply) is AttemptError:
                facts = reply._facts
            else:
                facts = facts_of(reply, classify=classify, output_delivered=self._delivered, now_unix_ms=now_unix_ms)
            fields["facts"] = facts.to_dict()
        if self._cost is not None:
            fields["cost"] = self._cost
        if self._units is not None:
            fields["usage"] = self._units
        if self._body_sha256 is not None:
            fields["request_body_sha256"] = self._body_sha256
        if self._model is not None:
            fields["model"] = self._model
        return fields


# ---- sealed runs --------------------------------------------------------------


class _Sealed:
    """A sealed run: the receipt evaluated by the core when the run ended; its
    digest and the bundle are computed on first use."""

    _sealed: _core.Sealed
    _bundle: Optional[Dict[str, Any]] = None
    #: Under repair (``repair=``): the ``retryledger.repair_chain.v1`` of the
    #: request and its repairs so far, this run last (docs/REPAIR.md).
    chain: Optional[Dict[str, Any]] = None
    #: Under repair: why no further repair followed, when the core refused one
    #: (``repair_over_budget``, ``repair_same_request``, ...).
    repair_refused: Optional[RetryledgerError] = None

    @property
    def terminal(self) -> str:
        """How the run ended (``completed``, ``stop_route_exhausted``, ...)."""
        return self._sealed.terminal

    @property
    def receipt(self) -> Dict[str, Any]:
        """The receipt as a plain dict."""
        return self._sealed.receipt

    @property
    def receipt_sha256(self) -> str:
        """Lowercase hex SHA-256 of the receipt's canonical JSON."""
        return self._sealed.receipt_sha256

    @property
    def bundle_json(self) -> str:
        """The bundle as canonical JSON (what ``python -m retryledger verify`` reads)."""
        return self._sealed.bundle_json

    @property
    def bundle(self) -> Dict[str, Any]:
        """The bundle (``attempts``, ``policy``, ``receipt``) as a plain dict."""
        if self._bundle is None:
            self._bundle = self._sealed.bundle
        return self._bundle


class RunResult(_Sealed, Generic[T]):
    """A completed run: the dispatch's ``value``, the ``bundle`` and its ``receipt``."""

    def __init__(self, value: T, sealed: _core.Sealed) -> None:
        #: What ``dispatch`` returned on the successful attempt.
        self.value = value
        self._sealed = sealed

    def __repr__(self) -> str:
        return f"RunResult(value={self.value!r}, receipt_sha256={self.receipt_sha256!r})"


class RunStoppedError(_Sealed, RetryledgerError):
    """The run ended without success; ``code`` is its terminal (``stop_route_exhausted``, ...).

    ``__cause__`` is the exception the last attempt raised, if any.
    """

    def __init__(self, sealed: _core.Sealed, message: str) -> None:
        RetryledgerError.__init__(self, sealed.terminal, message)
        self._sealed = sealed


class UnrecognizedDispatchError(RunStoppedError):
    """``dispatch`` raised an exception no rule recognizes (rule ``unrecognized``);
    it was recorded as indeterminate (never retried) and is this error's ``__cause__``."""


class RunCancelledError(_Sealed, asyncio.CancelledError):
    """The task running ``run_async`` was cancelled; the sealed run records it and
    ``code`` is its terminal.

    Between attempts the attempts document carries ``cancelled_at_ms``
    (terminal ``stop_cancelled``); during a dispatch that attempt is judged
    ``cancelled``, indeterminate (terminal ``stop_indeterminate``).
    """

    def __init__(self, sealed: _core.Sealed) -> None:
        super().__init__(f"run cancelled: {sealed.terminal}")
        self._sealed = sealed

    @property
    def code(self) -> str:
        """The terminal."""
        return self._sealed.terminal


# ---- facts --------------------------------------------------------------------


def _names(exc: BaseException) -> Tuple[List[str], List[str]]:
    """Class names along the MRO (without ``object``) of the error and its
    ``__cause__`` chain, and string ``code`` attributes and ``errno`` names
    along the same chain; at most 32 of each."""
    types: List[str] = []
    codes: List[str] = []
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for cls in type(e).__mro__[:-1]:
            name = cls.__name__
            if len(types) < _MAX_NAMES and len(name.encode("utf-8", "replace")) <= _MAX_NAME_BYTES:
                types.append(name)
        code = getattr(e, "code", None)
        if isinstance(code, str) and len(codes) < _MAX_NAMES and len(code.encode("utf-8", "replace")) <= _MAX_NAME_BYTES:
            codes.append(code)
        if isinstance(e, OSError) and isinstance(e.errno, int) and len(codes) < _MAX_NAMES:
            errno_name = _errno.errorcode.get(e.errno)
            if errno_name is not None:
                codes.append(errno_name)
        e = e.__cause__
    return types, codes


def _status(exc: BaseException) -> Optional[int]:
    """The first integer in 100..=599 among the error's HTTP status attributes."""
    response = getattr(exc, "response", None)
    for holder, name in (
        (exc, "status"),
        (exc, "status_code"),
        (exc, "statusCode"),
        (response, "status"),
        (response, "status_code"),
    ):
        if holder is None:
            continue
        value = getattr(holder, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def _headers(exc: Any) -> List[Tuple[str, str]]:
    """The headers the core reads (``READ_HEADERS``), from ``response.headers`` or ``headers``."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) if response is not None else None
    if headers is None:
        headers = getattr(exc, "headers", None)
    found: List[Tuple[str, str]] = []
    if headers is None:
        return found
    try:
        if hasattr(headers, "items"):
            for name, value in headers.items():
                if isinstance(name, str) and isinstance(value, str) and name.lower() in _READ:
                    found.append((name, value))
        else:
            get = getattr(headers, "get", None)
            if get is not None:
                for name in READ_HEADERS:
                    value = get(name)
                    if isinstance(value, str):
                        found.append((name, value))
    except Exception:
        return []
    return found


def _is_rate_limit(name: str) -> bool:
    n = name.lower()
    return n.startswith("x-ratelimit-") or n.startswith("anthropic-ratelimit-") or n in ("ratelimit", "ratelimit-policy")


def rate_limit_headers_of(holder: Any) -> List[Tuple[str, str]]:
    """The rate-limit headers (``x-ratelimit-*``, ``anthropic-ratelimit-*``,
    ``RateLimit``, ``RateLimit-Policy``) of a response, an error, a headers
    mapping or ``(name, value)`` pairs; ``[]`` when it holds none."""
    if holder is None:
        return []
    if hasattr(holder, "headers") or hasattr(holder, "response"):
        found = _headers(holder)
    else:
        found = []
        try:
            items = holder.items() if hasattr(holder, "items") else holder
            for pair in items:
                name, value = pair
                if isinstance(name, str) and isinstance(value, str) and name.lower() in _READ:
                    found.append((name, value))
        except Exception:
            return []
    return [(n, v) for n, v in found if _is_rate_limit(n)][:64]


def _bounded(text: str) -> str:
    """At most ``MAX_ERROR_BODY_BYTES + 1`` characters (a longer body stays
    oversize for the core), unpaired surrogates replaced."""
    cut = text[: MAX_ERROR_BODY_BYTES + 1]
    return cut.encode("utf-8", "replace").decode("utf-8")


def _body(exc: BaseException) -> Optional[str]:
    """The error response's body as text: ``response.text`` of a read
    response, else the error's ``body`` (text, or JSON of an object)."""
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            text = getattr(response, "text", None)
        except Exception:  # an unread streaming response
            text = None
        if isinstance(text, str) and text:
            return _bounded(text)
    body = getattr(exc, "body", None)
    if isinstance(body, str):
        return _bounded(body) if body else None
    if isinstance(body, (dict, list)):
        try:
            return _bounded(json.dumps(body, ensure_ascii=False, default=str))
        except (TypeError, ValueError):
            return None
    return None


def facts_of(
    exc: BaseException,
    *,
    classify: Optional[Classifier] = None,
    output_delivered: bool = False,
    cancelled: bool = False,
    now_unix_ms: Optional[int] = None,
) -> _core.Facts:
    """The facts a driver reports for an exception raised by ``dispatch``
    (docs/HOSTS.md, "Facts"); ``retryledger.judge(facts)`` gives the core's judgement."""
    if isinstance(exc, AttemptError) and not cancelled:
        return exc._facts
    outcome: Optional[_core.Outcome] = exc._outcome if isinstance(exc, AttemptError) else None
    if outcome is None and classify is not None:
        try:
            given = classify(exc)
            if given is not None:
                outcome = _explicit(given)[0]
        except Exception:
            outcome = None
    types, codes = _names(exc)
    headers = _headers(exc)
    status = _status(exc)
    body = _body(exc) if status is not None and not 200 <= status <= 299 else None
    if now_unix_ms is None:
        now_unix_ms = int(time.time() * 1000)
    try:
        return _Facts(
            result="raised",
            outcome=outcome,
            error_types=types,
            error_codes=codes,
            status=status,
            headers=headers,
            error_body=body,
            response_bytes_received=output_delivered,
            cancelled=cancelled,
            now_unix_ms=now_unix_ms,
        )
    except RetryledgerError:
        # Facts the core refuses (a name with an unpaired surrogate, a wall
        # clock out of range): report what is certain, as the TypeScript
        # driver does (raised, cancelled, output delivered).
        return _Facts(result="raised", cancelled=cancelled, response_bytes_received=output_delivered)


# ---- the shared bookkeeping -------------------------------------------------


def _wall_ms() -> float:
    return time.time() * 1000.0


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000.0)


async def _async_sleep_ms(ms: float) -> None:
    await asyncio.sleep(ms / 1000.0)


def _checked(
    policy: Union[Policy, Document], idempotency_key: str, key_scope: Optional[Tuple[str, str]] = None
) -> Policy:
    """The compiled policy, after checking that the key's digest (bare, or
    scoped by ``(tenant, operation)``) is the policy's key digest."""
    compiled = _policy_of(policy)
    if key_scope is not None:
        tenant, operation = key_scope
        if idempotency_key_sha256(idempotency_key, tenant=tenant, operation=operation) != compiled.idempotency_key_sha256:
            raise DriftError(
                "idempotency_key_drift",
                "the scoped digest of idempotency_key differs from the policy's idempotency_key_sha256",
                "/idempotency_key_sha256",
            )
        return compiled
    if compiled._verified_key != idempotency_key:
        if not isinstance(idempotency_key, str):
            raise DriftError("invalid_type", "the idempotency key is a str", "/idempotency_key")
        raw = idempotency_key.encode("utf-8", "surrogatepass")
        if hashlib.sha256(raw).hexdigest() != compiled.idempotency_key_sha256:
            raise DriftError(
                "idempotency_key_drift",
                "sha256(idempotency_key) differs from the policy's idempotency_key_sha256",
                "/idempotency_key_sha256",
            )
        compiled._verified_key = idempotency_key
    return compiled


def _schedule_for(compiled: Policy, price_schedule: Optional[Document]) -> Optional[str]:
    """The price schedule as JSON text after the core has checked it against
    the policy (:class:`PolicyError` otherwise), or ``None`` without one."""
    if price_schedule is None:
        return None
    text = to_text(price_schedule)
    check_price_schedule(compiled, text)
    return text


def _fleet_for(compiled: Policy, fleet: Optional[Fleet]) -> Optional[Fleet]:
    """The fleet a run admits through, checked by the core before anything is
    dispatched (``CompiledPolicy::require_fleet``): a policy with a fleet
    section needs one (:class:`DriftError` ``admission_missing``), and a
    fleet given to a policy without one is refused (``admission_unexpected``)."""
    if fleet is not None and not isinstance(fleet, Fleet):
        raise DriftError("invalid_type", "fleet= takes a retryledger.fleet.Fleet", "/fleet")
    compiled._compiled.require_fleet(fleet is not None)
    return fleet


def _reserve(tokens: Optional[int]) -> Optional[int]:
    """A run's own token reservation, checked (None: the fleet's ``reserve_tokens``)."""
    return None if tokens is None else check_integer("reserve_tokens", tokens)


class _Host:
    """What the sync and async drivers share: the session, the hooks, and the
    per-attempt bookkeeping (fleet admission, facts extraction and recording)."""

    # What every run sets is a slot; what a run rarely sets keeps its default
    # on the class until set (in the instance's dict, made only then), so a
    # plain run's host costs a few stores.
    __slots__ = ("session", "classify", "wall_clock", "on_attempt", "fleet", "policy", "last_error", "judgement", "__dict__")

    #: The route release of an admission not yet dispatched (its slot held).
    held: Optional[str] = None
    #: The tokens each attempt reserves under a token bucket (None: the fleet's).
    reserve_tokens: Optional[int] = None
    on_decision: Optional[DecisionCallback] = None
    on_sleep: Optional[SleepCallback] = None
    on_terminal: Optional[TerminalCallback] = None
    #: The output checks run on what dispatch returned (docs/REPAIR.md).
    checks: Optional[Tuple[Callable[[Any], Any], ...]] = None
    #: The verdicts of the last returned answer.
    verdicts: Optional[List[Any]] = None

    def __init__(
        self,
        compiled: Policy,
        classify: Optional[Classifier],
        wall_clock: Optional[Callable[[], float]],
        on_attempt: Optional[AttemptCallback],
        fleet: Optional[Fleet] = None,
        reserve_tokens: Optional[int] = None,
        hooks: Tuple[Optional[DecisionCallback], Optional[SleepCallback], Optional[TerminalCallback]] = (None, None, None),
        checks: Optional[Sequence[Callable[[Any], Any]]] = None,
    ) -> None:
        """The host of a run with these options: its session, its fleet
        (checked against the policy), its token reservation (checked), its
        hooks and output checks (only those given are stored)."""
        self.session = compiled._compiled.session()
        self.classify = classify
        self.wall_clock = wall_clock
        self.on_attempt = on_attempt
        #: The fleet admitting each attempt (None: the policy has no fleet section).
        self.fleet = _fleet_for(compiled, fleet)
        self.policy = compiled
        self.last_error: Optional[BaseException] = None
        self.judgement: Optional[_core.Judgement] = None
        if reserve_tokens is not None:
            self.reserve_tokens = _reserve(reserve_tokens)
        on_decision, on_sleep, on_terminal = hooks
        if on_decision is not None:
            self.on_decision = on_decision
        if on_sleep is not None:
            self.on_sleep = on_sleep
        if on_terminal is not None:
            self.on_terminal = on_terminal
        if checks:
            self.checks = tuple(checks)

    @property
    def hooked(self) -> bool:
        """Whether any hook is set."""
        return self.on_decision is not None or self.on_sleep is not None or self.on_terminal is not None

    def returned(self, value: Any) -> _core.Facts:
        """The facts of a returned answer: its output checks' verdicts,
        decoded by the core; a check that raises or a verdict the core refuses
        (its coded error becomes the run's cause) makes it unrecognized."""
        checks = self.checks
        if not checks:
            return _RETURNED
        try:
            verdicts = [check(value) for check in checks]
            facts = _Facts(result="returned", output_checks=verdicts)
        except Exception as exc:  # the validator broke: recorded, never retried
            self.last_error = exc
            return _CHECK_BROKE
        self.verdicts = verdicts
        self.last_error = None
        return facts

    def decided(self, plan: Union[_core.Dispatch, _core.Terminal]) -> None:
        """``on_decision`` with the core's decision."""
        if self.on_decision is not None:
            _call_hook("on_decision", self.on_decision, plan.to_dict())

    def sleeping(self, plan: _core.Dispatch, now: float) -> None:
        """``on_sleep`` with the wait planned before ``plan`` at ``now`` (run clock)."""
        if self.on_sleep is not None:
            at = int(now) if now > 0 else 0
            wait = int(math.ceil(plan.not_before_ms - now))
            _call_hook(
                "on_sleep",
                self.on_sleep,
                {
                    "ordinal": plan.ordinal,
                    "route_id": plan.route_id,
                    "at_ms": at,
                    "not_before_ms": plan.not_before_ms,
                    "sleep_ms": wait if wait > 0 else 0,
                },
            )

    def sealed(self) -> _core.Sealed:
        """The session sealed, and ``on_terminal`` given its receipt."""
        sealed = self.session.seal()
        if self.on_terminal is not None:
            _call_hook("on_terminal", self.on_terminal, json.loads(sealed.receipt_json))
        return sealed

    def epoch_ms(self) -> int:
        """The wall clock, Unix ms."""
        ms = int((self.wall_clock or _wall_ms)())
        return ms if ms > 0 else 0

    def admit(self, now: float) -> Tuple[Union[_core.Dispatch, _core.Terminal], float]:
        """Admit the planned attempt at ``now`` (run clock) through the fleet:
        the dispatch to make (perhaps on another route, its ``not_before_ms``
        after any queue wait) or the fleet's terminal, and how long to wait
        before admitting again (ms, 0 when admitted or stopped)."""
        fleet = self.fleet
        session = self.session
        wait = 0.0
        if fleet is not None:
            at = int(now)
            answer = fleet.admit(session, self.policy, at if at > 0 else 0, self.epoch_ms(), self.reserve_tokens)
            until = answer.get("wait_until_epoch_ms")
            if until is not None:
                wait = float(max(1, until - self.epoch_ms()))
        plan = session.next()
        if fleet is not None and wait == 0 and not isinstance(plan, _Terminal):
            self.held = plan.route_release_sha256
        return plan, wait

    async def next_attempt_async(
        self, clock: Callable[[], float], t0: float, sleep: Callable[[float], Awaitable[None]]
    ) -> Tuple[Union[_core.Dispatch, _core.Terminal], float]:
        """The next attempt and the run clock (ms) when it starts: the
        session's plan, slept until its ``not_before_ms``, admitted through
        the fleet (waiting while the admission limits ask to) and slept
        until the admitted start; a terminal when the run (or the fleet)
        ends. The sync drivers' is ``_SYNC_LOOP.next_attempt`` (in the
        extension), in the same order."""
        plan = self.session.next()
        self.decided(plan)
        if isinstance(plan, _Terminal):
            return plan, 0.0
        now = clock() - t0
        admitted = self.fleet is None
        while True:
            not_before = plan.not_before_ms
            if now < not_before:
                self.sleeping(plan, now)
            while now < not_before:
                await sleep(not_before - now)
                now = clock() - t0
            if admitted:
                return plan, now
            plan, wait = self.admit(now)
            if isinstance(plan, _Terminal):
                return plan, now
            if wait > 0:
                await sleep(wait)
                now = clock() - t0
            else:
                admitted = True

    def recorded(
        self,
        route_release_sha256: str,
        used_tokens: Optional[int] = None,
        headers: Optional[List[Tuple[str, str]]] = None,
    ) -> None:
        """After an observation: the attempt's outcome into its route's
        breaker, and its admission slot released (its tokens settled and the
        rate-limit ``headers`` of its response applied)."""
        fleet = self.fleet
        if fleet is not None:
            now = self.epoch_ms()
            self.held = None
            fleet.record(self.session, self.policy, now, route_release_sha256)
            fleet.release(self.session, self.policy, now, route_release_sha256, used_tokens, headers)

    def abandon(self) -> None:
        """The run ends between an admission and its dispatch (cancelled
        while waiting for the admitted start): release the admission slot."""
        fleet, held = self.fleet, self.held
        if fleet is not None and held is not None:
            self.held = None
            fleet.release(self.session, self.policy, self.epoch_ms(), held)

    def facts(self, step: Step, exc: BaseException, cancelled: bool = False) -> _core.Facts:
        """The facts of an attempt that raised (or was cancelled); a call the
        attempt refused to send (``request_drift``) raises instead."""
        if step._refused is not None:
            raise step._refused
        if step._rate_limits is None and self.fleet is not None:
            step._rate_limits = rate_limit_headers_of(exc) or None
        if isinstance(exc, AttemptError) and not cancelled:
            return exc._facts
        ms = int((self.wall_clock or _wall_ms)())
        return facts_of(
            exc,
            classify=None if cancelled else self.classify,
            output_delivered=step._delivered,
            cancelled=cancelled,
            now_unix_ms=ms if ms > 0 else 0,
        )

    def record(self, step: Step, now: float, facts: _core.Facts, error: Optional[BaseException]) -> None:
        """Record the attempt as completed at ``now`` (run clock, ms): the core
        judges ``facts``; ``error`` is what dispatch raised, if anything."""
        if error is not None:
            self.last_error = error
        started = step.started_at_ms
        completed = int(now)
        self.judgement = judgement = self.session.observe(
            started, completed if completed > started else started, step._cost, facts
        )
        self.after(step, judgement)

    def after(self, step: Step, judgement: _core.Judgement) -> None:
        """After an observation: the fleet's breaker record, then ``on_attempt``."""
        if self.fleet is not None:
            self.recorded(step.plan.route_release_sha256, step._tokens, step._rate_limits)
        if self.on_attempt is not None:
            _call_hook("on_attempt", self.on_attempt, self.session.attempts["attempts"][-1], judgement)

    def failure(self) -> RunStoppedError:
        sealed = self.sealed()
        count = sealed.receipt["attempt_count"]
        message = f"run ended with {sealed.terminal} after {count} attempt{'s' if count != 1 else ''}"
        judgement = self.judgement
        if judgement is not None and judgement.rule == "unrecognized":
            return UnrecognizedDispatchError(sealed, f"{message}; unrecognized {type(self.last_error).__name__}")
        return RunStoppedError(sealed, message)


#: The sync driver's loop (python/src/drive.rs), made once.
_SYNC_LOOP = _core.SyncLoop(Step, AttemptError, _RETURNED)


# ---- the drivers --------------------------------------------------------------


def run(
    policy: Union[Policy, Document],
    dispatch: Callable[[Step], T],
    idempotency_key: str,
    *,
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
    checks: Optional[Sequence[Callable[[Any], Any]]] = None,
    repair: Optional[Callable[[Any, List[Dict[str, Any]]], Any]] = None,
    request: Any = None,
) -> RunResult[T]:
    """Run one logical request to its terminal: the value and sealed run, or :class:`RunStoppedError`.

    ``key_scope`` is ``(tenant, operation)`` when the policy's key digest is
    scoped (:func:`retryledger.idempotency_key_sha256`). ``price_schedule``
    prices usage reported with ``step.usage`` (checked before the first dispatch).
    ``fleet`` (:class:`retryledger.fleet.Fleet`) admits each attempt against the
    fleet's breakers and retry budget and records each outcome in the breaker,
    for a policy with a ``fleet`` section (required then); a run the fleet stops
    raises :class:`RunStoppedError` with ``stop_circuit_open``,
    ``stop_retry_budget`` or ``stop_store_unavailable``.

    Hooks see the core's plain documents and never change the run:
    ``on_decision(decision)`` each decision, ``on_sleep(wait)`` before each
    planned wait, ``on_attempt(attempt, judgement)`` each recorded attempt,
    ``on_terminal(receipt)`` once at the end. A hook that raises is reported
    as a :class:`retryledger.HookWarning` (code ``hook_failed``).

    ``checks`` (:mod:`retryledger.checks`) are run on what dispatch returned;
    the core judges their verdicts (a refusal is ``policy_denied``, any other
    failed check ``invalid_output``). With ``repair(output, defects) ->
    request`` and a policy with a ``repair`` section, a run that stops on
    invalid output is followed by repairs (docs/REPAIR.md): each a new
    logical request (``step.request``, ``step.repair_ordinal``) with its own
    key (``<key>:repair:<n>``) under the deadline and cost the core leaves it;
    the result (or the error) carries the ``chain``."""
    if repair is not None:
        from ._repair import run_repaired

        return run_repaired(
            policy, dispatch, idempotency_key, repair=repair, request=request, checks=checks,
            key_scope=key_scope, clock=clock, sleep=sleep, classify=classify, wall_clock=wall_clock,
            on_attempt=on_attempt, price_schedule=price_schedule, fleet=fleet,
            on_decision=on_decision, on_sleep=on_sleep, on_terminal=on_terminal,
        )
    # The sync run keeps the session's loop in the extension: on the
    # machine it costs more than its speed line allows (docs/HOST_LOOP.md).
    compiled = _checked(policy, idempotency_key, key_scope)
    schedule = _schedule_for(compiled, price_schedule)
    if clock is None:
        clock = _monotonic_ms
    if sleep is None:
        sleep = _sleep_ms
    host = _Host(compiled, classify, wall_clock, on_attempt, fleet, reserve_tokens, (on_decision, on_sleep, on_terminal), checks)
    session = host.session
    if schedule is not None:
        session.set_price_schedule(schedule)
    # The loop of ``run_async`` (plan, wait, dispatch, observe), run in the
    # extension with this host's hooks: ``(value,)`` once an attempt completes the run.
    done = _SYNC_LOOP.run(host, dispatch, clock, sleep, idempotency_key, schedule)
    if done is not None:
        if host.hooked:
            host.decided(session.next())  # the terminal decision, as the loop would see it
            return RunResult(done[0], host.sealed())
        return RunResult(done[0], session.seal())
    raise host.failure() from host.last_error



async def _dispatched(
    host: _Host, step: Step, dispatch: Callable[[Step], Awaitable[T]], clock: Callable[[], float], t0: float
) -> Optional[Tuple[T]]:
    """Dispatch ``step`` and record what it gave at the completion time:
    ``(value,)`` when it returned, ``None`` when it raised. A cancellation
    propagates unrecorded (the caller records the attempt as cancelled)."""
    try:
        value = await dispatch(step)
    except Exception as exc:
        host.record(step, clock() - t0, host.facts(step, exc), exc)
        return None
    host.record(step, clock() - t0, host.returned(value), None)
    return (value,)


async def run_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[Step], Awaitable[T]],
    idempotency_key: str,
    *,
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
    checks: Optional[Sequence[Callable[[Any], Any]]] = None,
    repair: Optional[Callable[[Any, List[Dict[str, Any]]], Any]] = None,
    request: Any = None,
) -> RunResult[T]:
    """The async driver: like :func:`run`, with ``dispatch`` and ``sleep`` awaited
    (the fleet's store calls are made inline; the hooks are :func:`run`'s).

    Cancelling the task stops the run and raises :class:`RunCancelledError`
    carrying the sealed run; ``on_cancel`` receives that error first. On
    Python 3.11 and later ``await task`` re-raises it; 3.9 and 3.10 raise a
    new ``CancelledError`` whose ``__context__`` it is, and code that replaces
    the cancellation (``asyncio.wait_for``, task groups) may hide it, so use
    ``on_cancel`` where that matters.
    """
    if repair is not None:
        from ._repair import run_repaired_async

        return await run_repaired_async(
            policy, dispatch, idempotency_key, repair=repair, request=request, checks=checks,
            key_scope=key_scope, clock=clock, sleep=sleep, classify=classify, wall_clock=wall_clock,
            on_attempt=on_attempt, on_cancel=on_cancel, price_schedule=price_schedule, fleet=fleet,
            on_decision=on_decision, on_sleep=on_sleep, on_terminal=on_terminal,
        )
    if fleet is None:
        from ._plain import run_plain_async

        return await run_plain_async(
            policy,
            dispatch,
            idempotency_key,
            {
                "classify": classify, "clock": clock, "sleep": sleep, "wall_clock": wall_clock, "on_attempt": on_attempt,
                "on_cancel": on_cancel, "key_scope": key_scope, "price_schedule": price_schedule, "fleet": fleet,
                "reserve_tokens": reserve_tokens, "on_decision": on_decision, "on_sleep": on_sleep,
                "on_terminal": on_terminal, "checks": checks,
            },
        )
    # A fleet run keeps the session's loop (see ``run``).
    compiled = _checked(policy, idempotency_key, key_scope)
    schedule = _schedule_for(compiled, price_schedule)
    if clock is None:
        clock = _monotonic_ms
    if sleep is None:
        sleep = _async_sleep_ms
    host = _Host(compiled, classify, wall_clock, on_attempt, fleet, reserve_tokens, (on_decision, on_sleep, on_terminal), checks)
    session = host.session
    if schedule is not None:
        session.set_price_schedule(schedule)
    t0 = clock()
    step: Optional[Step] = None
    try:
        while True:
            plan, now = await host.next_attempt_async(clock, t0, sleep)
            if isinstance(plan, _Terminal):
                break
            step = Step(plan, idempotency_key, int(now) if now > 0 else 0, schedule, session)
            returned = await _dispatched(host, step, dispatch, clock, t0)
            step = None  # recorded: no longer in flight
            if returned is not None and session.terminal == "completed":
                host.last_error = None  # no cycle through the last error's traceback
                host.decided(session.next())  # the terminal decision
                return RunResult(returned[0], host.sealed())
    except asyncio.CancelledError as cancelled:
        now = clock() - t0
        at = int(now) if now > 0 else 0
        if step is not None:
            host.record(step, now, host.facts(step, cancelled, cancelled=True), None)
        else:
            host.abandon()
            session.cancel(at)
        plan = session.next()
        job = None if isinstance(plan, _Terminal) else plan.job
        if session.terminal is None and (job is None or job.get("kind") != "cancel"):
            # The attempt in flight was cancelled and the run goes on (a
            # cancelled poll of an async job plans the next poll): the run is
            # cancelled here, unless the planned cancel of a job left running
            # comes next.
            session.cancel(at)
            plan = session.next()
            job = None if isinstance(plan, _Terminal) else plan.job
        # Under cancel_left_running the cancellation of a run whose accepted
        # job is still running plans the job's cancel (docs/JOBS.md): sent
        # and recorded like any attempt (what it raises is a fact), then the
        # run is sealed.
        while not isinstance(plan, _Terminal) and job is not None and job.get("kind") == "cancel":
            plan, now = await host.next_attempt_async(clock, t0, sleep)
            if isinstance(plan, _Terminal):
                break
            done = Step(plan, idempotency_key, int(now) if now > 0 else 0, schedule, session)
            try:
                await _dispatched(host, done, dispatch, clock, t0)
            except asyncio.CancelledError as again:
                # Cancelled again while the cancel was in flight: recorded so.
                host.record(done, clock() - t0, host.facts(done, again, cancelled=True), None)
            plan = session.next()
            job = None if isinstance(plan, _Terminal) else plan.job
        error = RunCancelledError(host.sealed())
        if on_cancel is not None:
            on_cancel(error)
        raise error from cancelled
    raise host.failure() from host.last_error
