"""The drivers: the single retry owner of one logical request.

``run`` and ``run_async`` ask the core what to dispatch next and not before
when, sleep until then, call ``dispatch(step)`` exactly once per planned
attempt, classify what it returned or raised, record it, and seal the run in a
bundle (policy, attempts, receipt). Conventions, the same as the TypeScript
driver's:

* The run clock is milliseconds since the driver started. ``clock`` returns
  milliseconds on any monotonic origin and ``sleep`` takes milliseconds (both
  injectable); the driver sleeps until ``not_before_ms`` and makes no sleep
  call when there is nothing to wait for.
* ``step`` carries ``ordinal``, ``route_id``, ``route_ordinal``,
  ``route_release_sha256``, the raw ``idempotency_key`` (its SHA-256 must
  equal the policy's ``idempotency_key_sha256``, checked before the first
  dispatch), ``remaining_ms`` until the deadline, ``deadline_ms``,
  ``started_at_ms`` and ``reserve_cost``. ``step.charge(cost)``
  records the attempt's actual cost; an attempt never charged costs its
  ``reserve_cost``.
* A returned value is a success. A raised exception is classified by the
  outcome it carries (:class:`AttemptError`), by the ``classify`` hook, or by
  its HTTP status and headers (``status_code`` and ``response.headers``, as
  the openai package's ``APIStatusError`` has). Anything else is
  unrecognized: recorded as indeterminate ``unknown_provider_acceptance``
  (never retried) and raised as :class:`UnrecognizedDispatchError` whose
  ``__cause__`` is the original exception.
* A run that ends without success raises :class:`RunStoppedError` (``code`` is the
  terminal) carrying the bundle. Cancelling ``run_async``'s task records the
  cancellation (``cancelled_at_ms`` between attempts, an indeterminate attempt
  during a dispatch) and raises :class:`RunCancelledError`, a subclass of
  ``asyncio.CancelledError`` that carries the bundle.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Generic,
    Mapping,
    Optional,
    TypeVar,
    Union,
)

from . import _core
from ._api import Document, Policy, call, check_integer, core_error, to_text
from ._errors import DecodeError, DriftError, RetryledgerError

__all__ = [
    "AttemptError",
    "Step",
    "RunResult",
    "RunStoppedError",
    "UnrecognizedDispatchError",
    "RunCancelledError",
    "Classifier",
    "run",
    "run_async",
    "http_outcome",
]

T = TypeVar("T")

#: A classifier maps an exception to an outcome (a mapping or JSON text), or
#: ``None`` to leave it to the next rule.
Classifier = Callable[[BaseException], Union[Mapping[str, Any], str, None]]

_OUTCOME_CACHE: Dict[str, _core.Outcome] = {}


def _outcome(outcome: Union[Mapping[str, Any], str]) -> _core.Outcome:
    """An outcome document decoded strictly by the core, once per distinct text (small cache)."""
    text = outcome if isinstance(outcome, str) else to_text(outcome)
    decoded = _OUTCOME_CACHE.get(text)
    if decoded is None:
        decoded = call(_core.Outcome, text)
        canonical = decoded.json
        # Equal outcomes share one object, so the drivers test success by identity.
        decoded = _OUTCOME_CACHE.get(canonical, decoded)
        if len(_OUTCOME_CACHE) < 256:
            _OUTCOME_CACHE.setdefault(canonical, decoded)
            _OUTCOME_CACHE[text] = decoded
    return decoded


SUCCESS = _outcome('{"class":"success"}')
UNKNOWN_ACCEPTANCE = _outcome('{"class":"indeterminate","kind":"unknown_provider_acceptance"}')


class AttemptError(Exception):
    """Raise from ``dispatch`` to say how an attempt failed.

    ``outcome`` is an outcome document, e.g. ``{"class": "retryable", "kind":
    "rate_limited", "retry_after_ms": 250}``; it is checked at construction
    (:class:`DecodeError` if malformed).
    """

    def __init__(self, outcome: Union[Mapping[str, Any], str], message: Optional[str] = None) -> None:
        decoded = _OUTCOME_CACHE.get(outcome) if isinstance(outcome, str) else None
        self._outcome = decoded if decoded is not None else _outcome(outcome)
        if self._outcome is SUCCESS:
            raise DecodeError("invalid_value", "an AttemptError carries a failure, not success", "/class")
        if message is None:
            super().__init__()
        else:
            super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.outcome_json

    def __repr__(self) -> str:
        return f"AttemptError({self.outcome_json!r})"

    @property
    def outcome_json(self) -> str:
        """The outcome as canonical JSON."""
        return self._outcome.json

    @property
    def outcome(self) -> dict[str, Any]:
        """The outcome as a plain dict."""
        result: dict[str, Any] = json.loads(self.outcome_json)
        return result

    @classmethod
    def retryable(
        cls, kind: str, retry_after_ms: Optional[int] = None, message: Optional[str] = None
    ) -> "AttemptError":
        """A retryable failure: ``timeout_before_response``, ``rate_limited`` or ``unavailable``."""
        hint = "" if retry_after_ms is None else f',"retry_after_ms":{check_integer("retry_after_ms", retry_after_ms)}'
        return cls(f'{{"class":"retryable","kind":{json.dumps(kind)}{hint}}}', message)

    @classmethod
    def non_retryable(cls, kind: str, message: Optional[str] = None) -> "AttemptError":
        """A failure no other attempt repairs (``rejected``, ``invalid_request``, ...)."""
        return cls(f'{{"class":"non_retryable","kind":{json.dumps(kind)}}}', message)

    @classmethod
    def indeterminate(cls, kind: str, message: Optional[str] = None) -> "AttemptError":
        """An outcome to reconcile, never retried (``unknown_provider_acceptance``, ...)."""
        return cls(f'{{"class":"indeterminate","kind":{json.dumps(kind)}}}', message)


class Step:
    """One planned attempt, as ``dispatch`` receives it."""

    __slots__ = (
        "ordinal",
        "route_id",
        "route_ordinal",
        "route_release_sha256",
        "idempotency_key",
        "remaining_ms",
        "deadline_ms",
        "started_at_ms",
        "reserve_cost",
        "_cost",
    )

    def __init__(self, plan: _core._Plan, idempotency_key: str, started_at_ms: int) -> None:
        ordinal, route_id, route_ordinal, _, reserve_cost, deadline_ms, release = plan
        #: Global ordinal of the attempt, from 1.
        self.ordinal = ordinal
        #: The route to dispatch to.
        self.route_id = route_id
        #: Ordinal on the route, from 1.
        self.route_ordinal = route_ordinal
        #: The exact route release the policy names.
        self.route_release_sha256 = release
        #: The raw idempotency key; send it with every attempt.
        self.idempotency_key = idempotency_key
        #: Milliseconds left until the run's deadline when the attempt started.
        self.remaining_ms = deadline_ms - started_at_ms if deadline_ms > started_at_ms else 0
        #: The run's deadline on the run clock, ms.
        self.deadline_ms = deadline_ms
        #: When the attempt started on the run clock, ms.
        self.started_at_ms = started_at_ms
        #: Worst-case cost reserved for this attempt.
        self.reserve_cost = reserve_cost
        self._cost: Optional[int] = None

    def charge(self, cost: int) -> None:
        """Record actual cost of this attempt (adds up when called more than once)."""
        cost = check_integer("cost", cost)
        self._cost = check_integer("cost", cost + (self._cost or 0))

    @property
    def cost(self) -> int:
        """The cost recorded for this attempt: what was charged, else ``reserve_cost``."""
        return self.reserve_cost if self._cost is None else self._cost

    def __repr__(self) -> str:
        return (
            f"Step(ordinal={self.ordinal}, route_id={self.route_id!r}, "
            f"route_ordinal={self.route_ordinal}, remaining_ms={self.remaining_ms}, "
            f"reserve_cost={self.reserve_cost})"
        )


class _Sealed:
    """A sealed run: the receipt evaluated by the core when the run ended (with
    the digests of the policy and the attempts); its own digest and the
    bundle's JSON are computed on first use, and parsed on first use."""

    _sealed: _core.Sealed
    _receipt_sha256: Optional[str]
    _bundle_json: Optional[str]
    _bundle: Optional[dict[str, Any]]

    def _seal(self, sealed: _core.Sealed) -> None:
        self._sealed = sealed
        self._receipt_sha256 = None
        self._bundle_json = None
        self._bundle = None

    @property
    def terminal(self) -> str:
        """How the run ended (``completed``, ``stop_route_exhausted``, ...)."""
        return self._sealed.terminal

    @property
    def receipt_sha256(self) -> str:
        """Lowercase hex SHA-256 of the receipt's canonical JSON."""
        if self._receipt_sha256 is None:
            self._receipt_sha256 = self._sealed.receipt_sha256
        return self._receipt_sha256

    @property
    def bundle_json(self) -> str:
        """The bundle as canonical JSON (what ``python -m retryledger verify`` reads)."""
        if self._bundle_json is None:
            self._bundle_json = self._sealed.bundle_json
        return self._bundle_json

    @property
    def bundle(self) -> dict[str, Any]:
        """The bundle (``attempts``, ``policy``, ``receipt``) as a plain dict."""
        if self._bundle is None:
            self._bundle = json.loads(self.bundle_json)
        return self._bundle

    @property
    def receipt(self) -> dict[str, Any]:
        """The receipt as a plain dict."""
        if self._bundle is not None:
            receipt: dict[str, Any] = self._bundle["receipt"]
            return receipt
        parsed: dict[str, Any] = json.loads(self._sealed.receipt_json)
        return parsed


class RunResult(_Sealed, Generic[T]):
    """A completed run: the dispatch's ``value``, the ``bundle`` and its ``receipt``."""

    def __init__(self, value: T, sealed: _core.Sealed) -> None:
        #: What ``dispatch`` returned on the successful attempt.
        self.value = value
        self._seal(sealed)

    def __repr__(self) -> str:
        return f"RunResult(value={self.value!r}, receipt_sha256={self.receipt_sha256!r})"


class RunStoppedError(_Sealed, RetryledgerError):
    """The run ended without success; ``code`` is its terminal (``stop_route_exhausted``, ...).

    ``__cause__`` is the exception the last attempt raised, if any.
    """

    def __init__(self, sealed: _core.Sealed, message: str) -> None:
        RetryledgerError.__init__(self, sealed.terminal, message)
        self._seal(sealed)


class UnrecognizedDispatchError(RunStoppedError):
    """``dispatch`` raised an exception no rule classifies; it was recorded as
    indeterminate (never retried) and is this error's ``__cause__``."""


class RunCancelledError(_Sealed, asyncio.CancelledError):
    """The task running ``run_async`` was cancelled; the bundle records it.

    Between attempts the attempts document carries ``cancelled_at_ms``
    (terminal ``stop_cancelled``); during a dispatch that attempt is recorded
    as indeterminate (terminal ``stop_indeterminate``).
    """

    def __init__(self, sealed: _core.Sealed) -> None:
        super().__init__(f"run cancelled: {sealed.terminal}")
        self._seal(sealed)


_RETRY_HEADERS = ("retry-after-ms", "retry-after")


def _headers_of(exc: BaseException) -> list[list[str]]:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        headers = getattr(exc, "headers", None)
    found: list[list[str]] = []
    if headers is None:
        return found
    get = getattr(headers, "get", None)
    if get is None:
        return found
    for name in _RETRY_HEADERS:
        try:
            value = get(name)
        except Exception:
            continue
        if isinstance(value, str):
            found.append([name, value])
    return found


def http_outcome(exc: BaseException) -> Optional[str]:
    """The outcome of an exception carrying an HTTP status (``status_code``) and
    headers (``response.headers``), or ``None`` when it carries none or an
    unusable one. Only ``retry-after-ms`` and ``retry-after`` are read."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, bool) or not isinstance(status, int):
        return None
    observation = {
        "headers": _headers_of(exc),
        "now_unix_ms": int(time.time() * 1000),
        "status": status,
    }
    try:
        outcome = _core.classify_http(json.dumps(observation, separators=(",", ":")))
    except _core.CoreError:
        return None
    # An exception is never a success, whatever status it carries.
    return None if outcome == '{"class":"success"}' else outcome


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000.0)


async def _async_sleep_ms(ms: float) -> None:
    await asyncio.sleep(ms / 1000.0)


def _checked(policy: Union[Policy, Document], idempotency_key: str) -> Policy:
    """The compiled policy, after checking that sha256(key) is the policy's key digest."""
    compiled = policy if isinstance(policy, Policy) else Policy(policy)
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


def _classified(exc: BaseException, classify: Optional[Classifier]) -> Optional[_core.Outcome]:
    """The outcome of a raised exception, or ``None`` when no rule recognizes it."""
    if isinstance(exc, AttemptError):
        return exc._outcome
    if classify is not None:
        try:
            given = classify(exc)
            if given is not None:
                decoded = _outcome(given)
                # An exception is never a success, whatever a classifier says.
                return None if decoded is SUCCESS else decoded
        except Exception:
            pass
    text = http_outcome(exc)
    return None if text is None else _outcome(text)


def _record(state: _core.Run, step: Step, now: float, outcome: _core.Outcome) -> Optional[_core._Plan]:
    """Record the attempt as completed at ``now``; the next plan."""
    started = step.started_at_ms
    completed = int(now)
    cost = step._cost
    try:
        return state.record(
            started,
            completed if completed > started else started,
            step.reserve_cost if cost is None else cost,
            outcome,
        )
    except _core.CoreError as e:
        raise core_error(e) from None


def _seal(state: _core.Run) -> _core.Sealed:
    try:
        return state.seal()
    except _core.CoreError as e:
        raise core_error(e) from None


def _failure(state: _core.Run, last_error: Optional[BaseException], unrecognized: bool) -> RunStoppedError:
    sealed = _seal(state)
    count = state.attempt_count
    message = f"run ended with {sealed.terminal} after {count} attempt{'s' if count != 1 else ''}"
    if unrecognized:
        return UnrecognizedDispatchError(sealed, f"{message}; unrecognized {type(last_error).__name__}")
    return RunStoppedError(sealed, message)


def run(
    policy: Union[Policy, Document],
    dispatch: Callable[[Step], T],
    idempotency_key: str,
    *,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
) -> RunResult[T]:
    """Run one logical request to its terminal: the value and sealed bundle, or :class:`RunStoppedError`."""
    compiled = _checked(policy, idempotency_key)
    if clock is None:
        clock = _monotonic_ms
    if sleep is None:
        sleep = _sleep_ms
    state = compiled._compiled.start()
    t0 = clock()
    last_error: Optional[BaseException] = None
    unrecognized = False
    plan = state.next()
    while plan is not None:
        now = clock() - t0
        not_before = plan[3]
        while now < not_before:
            sleep(not_before - now)
            now = clock() - t0
        started = int(now) if now > 0 else 0
        step = Step(plan, idempotency_key, started)
        try:
            value = dispatch(step)
        except Exception as exc:
            last_error = exc
            outcome = exc._outcome if isinstance(exc, AttemptError) else _classified(exc, classify)
            if outcome is None:
                unrecognized = True
                outcome = UNKNOWN_ACCEPTANCE
        else:
            outcome = SUCCESS
        plan = _record(state, step, clock() - t0, outcome)
        if outcome is SUCCESS and state.terminal == "completed":
            return RunResult(value, _seal(state))
    raise _failure(state, last_error, unrecognized) from last_error


async def run_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[Step], Awaitable[T]],
    idempotency_key: str,
    *,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    on_cancel: Optional[Callable[[RunCancelledError], None]] = None,
) -> RunResult[T]:
    """The async driver: like :func:`run`, with ``dispatch`` and ``sleep`` awaited.

    Cancelling the task stops the run and raises :class:`RunCancelledError`
    carrying the bundle; ``on_cancel`` receives that error first. On Python
    3.11 and later ``await task`` re-raises it; 3.9 and 3.10 raise a new
    ``CancelledError`` whose ``__context__`` it is, and code that replaces the
    cancellation (``asyncio.wait_for``, task groups) may hide it, so use
    ``on_cancel`` where that matters.
    """
    compiled = _checked(policy, idempotency_key)
    if clock is None:
        clock = _monotonic_ms
    if sleep is None:
        sleep = _async_sleep_ms
    state = compiled._compiled.start()
    t0 = clock()
    last_error: Optional[BaseException] = None
    unrecognized = False
    step: Optional[Step] = None
    plan = state.next()
    try:
        while plan is not None:
            now = clock() - t0
            not_before = plan[3]
            while now < not_before:
                await sleep(not_before - now)
                now = clock() - t0
            started = int(now) if now > 0 else 0
            step = Step(plan, idempotency_key, started)
            try:
                value = await dispatch(step)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                last_error = exc
                outcome = _classified(exc, classify)
                if outcome is None:
                    unrecognized = True
                    outcome = UNKNOWN_ACCEPTANCE
            else:
                outcome = SUCCESS
            plan = _record(state, step, clock() - t0, outcome)
            step = None
            if outcome is SUCCESS and state.terminal == "completed":
                result: RunResult[T] = RunResult(value, _seal(state))
                return result
    except asyncio.CancelledError as cancelled:
        now = max(clock() - t0, 0.0)
        if step is not None:
            _record(state, step, now, UNKNOWN_ACCEPTANCE)
        else:
            try:
                state.cancel(int(now))
            except _core.CoreError as e:
                raise core_error(e) from cancelled
        error = RunCancelledError(_seal(state))
        if on_cancel is not None:
            on_cancel(error)
        raise error from cancelled
    raise _failure(state, last_error, unrecognized) from last_error
