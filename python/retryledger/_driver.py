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
* ``step`` carries ``ordinal``, ``route_id``, ``route_ordinal``, the raw
  ``idempotency_key`` (its SHA-256 must equal the policy's
  ``idempotency_key_sha256``, checked before the first dispatch),
  ``remaining_ms`` until the deadline and ``reserve_cost``. ``step.charge(cost)``
  records the attempt's actual cost; an attempt never charged costs its
  ``reserve_cost``.
* A returned value is a success. A raised exception is classified by the
  outcome it carries (:class:`AttemptError`), by the ``classify`` hook, or by
  its HTTP status and headers (``status_code`` and ``response.headers``, as
  the openai package's ``APIStatusError`` has). Anything else is
  unrecognized: recorded as indeterminate ``unknown_provider_acceptance``
  (never retried) and raised as :class:`UnrecognizedFailure` whose
  ``__cause__`` is the original exception.
* A run that ends without success raises :class:`RunFailed` (``code`` is the
  terminal) carrying the bundle. Cancelling ``run_async``'s task records the
  cancellation (``cancelled_at_ms`` between attempts, an indeterminate attempt
  during a dispatch) and raises :class:`RunCancelled`, a subclass of
  ``asyncio.CancelledError`` that carries the bundle.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
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
    Tuple,
    TypeVar,
    Union,
)

from . import _core
from ._api import Document, Policy, call, check_integer, core_error, to_text
from ._errors import DriftError, RetryledgerError

__all__ = [
    "AttemptError",
    "Step",
    "RunResult",
    "RunFailed",
    "UnrecognizedFailure",
    "RunCancelled",
    "Classifier",
    "run",
    "run_async",
    "http_outcome",
]

T = TypeVar("T")

#: A classifier maps an exception to an outcome (a mapping or JSON text), or
#: ``None`` to leave it to the next rule.
Classifier = Callable[[BaseException], Union[Mapping[str, Any], str, None]]

SUCCESS = '{"class":"success"}'
UNKNOWN_ACCEPTANCE = '{"class":"indeterminate","kind":"unknown_provider_acceptance"}'

_OUTCOME_CACHE: Dict[str, str] = {}


def _canonical_outcome(outcome: Union[Mapping[str, Any], str]) -> str:
    """An outcome document checked by the core and in canonical form (small cache)."""
    text = outcome if isinstance(outcome, str) else to_text(outcome)
    canonical = _OUTCOME_CACHE.get(text)
    if canonical is None:
        canonical = call(_core.outcome, text)
        if len(_OUTCOME_CACHE) < 256:
            _OUTCOME_CACHE[text] = canonical
    return canonical


class AttemptError(Exception):
    """Raise from ``dispatch`` to say how an attempt failed.

    ``outcome`` is an outcome document, e.g. ``{"class": "retryable", "kind":
    "rate_limited", "retry_after_ms": 250}``; it is checked at construction
    (:class:`DecodeError` if malformed).
    """

    outcome_json: str

    def __init__(self, outcome: Union[Mapping[str, Any], str], message: Optional[str] = None) -> None:
        self.outcome_json = _canonical_outcome(outcome)
        super().__init__(message if message is not None else self.outcome_json)

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
        "idempotency_key",
        "remaining_ms",
        "reserve_cost",
        "_cost",
    )

    def __init__(
        self,
        ordinal: int,
        route_id: str,
        route_ordinal: int,
        idempotency_key: str,
        remaining_ms: int,
        reserve_cost: int,
    ) -> None:
        #: Global ordinal of the attempt, from 1.
        self.ordinal = ordinal
        #: The route to dispatch to.
        self.route_id = route_id
        #: Ordinal on the route, from 1.
        self.route_ordinal = route_ordinal
        #: The raw idempotency key; send it with every attempt.
        self.idempotency_key = idempotency_key
        #: Milliseconds left until the run's deadline.
        self.remaining_ms = remaining_ms
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
    """A sealed run: the bundle as canonical JSON, parsed on first use."""

    bundle_json: str
    receipt_sha256: str
    terminal: str
    _bundle: Optional[dict[str, Any]]

    def _seal(self, bundle_json: str, receipt_sha256: str, terminal: str) -> None:
        self.bundle_json = bundle_json
        self.receipt_sha256 = receipt_sha256
        self.terminal = terminal
        self._bundle = None

    @property
    def bundle(self) -> dict[str, Any]:
        """The bundle (``policy``, ``attempts``, ``receipt``) as a plain dict."""
        if self._bundle is None:
            self._bundle = json.loads(self.bundle_json)
        return self._bundle

    @property
    def receipt(self) -> dict[str, Any]:
        """The receipt as a plain dict."""
        receipt: dict[str, Any] = self.bundle["receipt"]
        return receipt


class RunResult(_Sealed, Generic[T]):
    """A completed run: the dispatch's ``value``, the ``bundle`` and its ``receipt``."""

    def __init__(self, value: T, bundle_json: str, receipt_sha256: str) -> None:
        self.value = value
        self._seal(bundle_json, receipt_sha256, "completed")

    def __repr__(self) -> str:
        return f"RunResult(value={self.value!r}, receipt_sha256={self.receipt_sha256!r})"


class RunFailed(_Sealed, RetryledgerError):
    """The run ended without success; ``code`` is its terminal (``stop_route_exhausted``, ...).

    ``__cause__`` is the exception the last attempt raised, if any.
    """

    def __init__(self, terminal: str, bundle_json: str, receipt_sha256: str, message: str) -> None:
        RetryledgerError.__init__(self, terminal, message)
        self._seal(bundle_json, receipt_sha256, terminal)


class UnrecognizedFailure(RunFailed):
    """``dispatch`` raised an exception no rule classifies; it was recorded as
    indeterminate (never retried) and is this error's ``__cause__``."""


class RunCancelled(_Sealed, asyncio.CancelledError):
    """The task running ``run_async`` was cancelled; the bundle records it.

    Between attempts the attempts document carries ``cancelled_at_ms``
    (terminal ``stop_cancelled``); during a dispatch that attempt is recorded
    as indeterminate (terminal ``stop_indeterminate``).
    """

    def __init__(self, terminal: str, bundle_json: str, receipt_sha256: str) -> None:
        super().__init__(f"run cancelled: {terminal}")
        self._seal(bundle_json, receipt_sha256, terminal)


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
    return None if outcome == SUCCESS else outcome


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000.0)


async def _async_sleep_ms(ms: float) -> None:
    await asyncio.sleep(ms / 1000.0)


_Plan = Tuple[int, str, int, int, int, int]


class _Session:
    """State shared by the sync and async drivers for one run."""

    __slots__ = ("run", "key", "clock", "t0", "classify", "last_error", "unrecognized")

    def __init__(
        self,
        policy: Union[Policy, Document],
        idempotency_key: str,
        clock: Optional[Callable[[], float]],
        classify: Optional[Classifier],
    ) -> None:
        compiled = policy if isinstance(policy, Policy) else Policy(policy)
        if not isinstance(idempotency_key, str):
            raise DriftError("invalid_type", "the idempotency key is a str", "/idempotency_key")
        digest = hashlib.sha256(idempotency_key.encode("utf-8", "surrogatepass")).hexdigest()
        if digest != compiled.idempotency_key_sha256:
            raise DriftError(
                "idempotency_key_drift",
                "sha256(idempotency_key) differs from the policy's idempotency_key_sha256",
                "/idempotency_key_sha256",
            )
        self.run: _core.Run = compiled._compiled.start()
        self.key = idempotency_key
        self.clock = clock or _monotonic_ms
        self.t0 = self.clock()
        self.classify = classify
        self.last_error: Optional[BaseException] = None
        self.unrecognized = False

    def elapsed(self) -> float:
        """Milliseconds on the run clock (never negative)."""
        return max(self.clock() - self.t0, 0.0)

    def step(self, plan: _Plan, started: int) -> Step:
        ordinal, route_id, route_ordinal, _, reserve_cost, deadline_ms = plan
        return Step(ordinal, route_id, route_ordinal, self.key, max(deadline_ms - started, 0), reserve_cost)

    def record(self, started: int, step: Step, outcome: str) -> None:
        completed = max(int(self.elapsed()), started)
        try:
            self.run.record(started, completed, step.cost, outcome)
        except _core.CoreError as e:
            raise core_error(e) from None

    def outcome_of(self, exc: BaseException) -> str:
        """Classify a raised exception; remember it for the error the run may raise."""
        self.last_error = exc
        if isinstance(exc, AttemptError):
            return exc.outcome_json
        if self.classify is not None:
            try:
                given = self.classify(exc)
                if given is not None:
                    return _canonical_outcome(given)
            except Exception:
                pass
        outcome = http_outcome(exc)
        if outcome is not None:
            return outcome
        self.unrecognized = True
        return UNKNOWN_ACCEPTANCE

    def sealed(self) -> Tuple[str, str, str]:
        try:
            bundle_json, receipt_sha256 = self.run.seal()
        except _core.CoreError as e:
            raise core_error(e) from None
        return bundle_json, receipt_sha256, self.run.terminal or ""

    def failure(self) -> RunFailed:
        bundle_json, receipt_sha256, terminal = self.sealed()
        count = self.run.attempt_count
        message = f"run ended with {terminal} after {count} attempt{'s' if count != 1 else ''}"
        if self.unrecognized:
            return UnrecognizedFailure(
                terminal, bundle_json, receipt_sha256, message + f"; unrecognized {type(self.last_error).__name__}"
            )
        return RunFailed(terminal, bundle_json, receipt_sha256, message)


def run(
    policy: Union[Policy, Document],
    dispatch: Callable[[Step], T],
    idempotency_key: str,
    *,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
) -> RunResult[T]:
    """Run one logical request to its terminal; the value and sealed bundle, or :class:`RunFailed`."""
    s = _Session(policy, idempotency_key, clock, classify)
    sleep = sleep or _sleep_ms
    run_state = s.run
    while True:
        plan = run_state.next()
        if plan is None:
            break
        not_before = plan[3]
        now = s.elapsed()
        while now < not_before:
            sleep(not_before - now)
            now = s.elapsed()
        started = int(now)
        step = s.step(plan, started)
        try:
            value = dispatch(step)
        except Exception as exc:
            s.record(started, step, s.outcome_of(exc))
            continue
        s.record(started, step, SUCCESS)
        if run_state.terminal == "completed":
            bundle_json, receipt_sha256 = run_state.seal()
            return RunResult(value, bundle_json, receipt_sha256)
    raise s.failure() from s.last_error


async def run_async(
    policy: Union[Policy, Document],
    dispatch: Callable[[Step], Union[Awaitable[T], T]],
    idempotency_key: str,
    *,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
) -> RunResult[T]:
    """The async driver: like :func:`run`, with ``dispatch`` and ``sleep`` awaited.

    Cancelling the task stops the run and raises :class:`RunCancelled` with the bundle.
    """
    s = _Session(policy, idempotency_key, clock, classify)
    sleep = sleep or _async_sleep_ms
    run_state = s.run
    step: Optional[Step] = None
    started = 0
    try:
        while True:
            plan = run_state.next()
            if plan is None:
                break
            not_before = plan[3]
            now = s.elapsed()
            while now < not_before:
                await sleep(not_before - now)
                now = s.elapsed()
            started = int(now)
            step = s.step(plan, started)
            try:
                value: Any = dispatch(step)
                if inspect.isawaitable(value):
                    value = await value
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                s.record(started, step, s.outcome_of(exc))
                step = None
                continue
            s.record(started, step, SUCCESS)
            step = None
            if run_state.terminal == "completed":
                bundle_json, receipt_sha256 = run_state.seal()
                result: RunResult[T] = RunResult(value, bundle_json, receipt_sha256)
                return result
    except asyncio.CancelledError as cancelled:
        if step is not None:
            s.record(started, step, UNKNOWN_ACCEPTANCE)
        else:
            try:
                run_state.cancel(int(s.elapsed()))
            except _core.CoreError as e:
                raise core_error(e) from cancelled
        raise RunCancelled(*s.sealed()) from cancelled
    raise s.failure() from s.last_error
