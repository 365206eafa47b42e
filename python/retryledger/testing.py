"""A testing kit for suites that run code under retryledger: a fake clock
under which a minute of backoff takes no wall time, and a seeded fault
injector that wraps a dispatch function (and, with
:class:`retryledger.httpx.FaultTransport`, an ``httpx`` transport) and injects
429s (with any hint form), 5xx, 529, timeouts, connection resets and slow
answers, by script or by rate.

Every injected failure carries the ``retryledger-injected-fault`` header, so
the core marks its attempt ``injected_fault`` and the receipt counts
``injected_faults``: a receipt of a run with injected faults can never pass
for production evidence. Nothing here decides anything: the injected errors
and responses go through the same facts and the same core rules as real
ones. The TypeScript package has the same kit (``retryledger/testing``).
docs/TESTING.md.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

__all__ = [
    "INJECTED_FAULT_HEADER",
    "FakeClock",
    "FaultPlanError",
    "InjectedFault",
    "inject_faults",
]

#: The header every injected failure carries (the core's ``INJECTED_FAULT_HEADER``).
INJECTED_FAULT_HEADER = "retryledger-injected-fault"

#: A fault: ``{"kind": "rate_limited", "retry_after": "30"}`` (or
#: ``"retry_after_ms"``, ``"status"``), ``{"kind": "unavailable"}`` (``"status"``,
#: ``"retry_after_ms"``), ``{"kind": "overloaded"}`` (529), ``{"kind": "timeout"}``,
#: ``{"kind": "reset"}``, ``{"kind": "slow", "ms": 700}``.
Fault = Mapping[str, Any]

_RATED = ("rate_limited", "unavailable", "overloaded", "timeout", "reset")
_KINDS = _RATED + ("slow",)


class FakeClock:
    """The drivers' ``clock`` (call it) and ``sleep`` / ``async_sleep``: time
    moves only when slept or advanced, in milliseconds."""

    def __init__(self) -> None:
        #: Milliseconds since the clock was made.
        self.now = 0.0
        #: Every sleep asked for, ms.
        self.sleeps: List[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, ms: float) -> None:
        """Returns at once, the clock moved on."""
        self.sleeps.append(ms)
        self.now += ms

    async def async_sleep(self, ms: float) -> None:
        """:meth:`sleep` for ``run_async``."""
        self.sleep(ms)

    def advance(self, ms: float) -> None:
        """Move the clock on, as an attempt that takes ``ms`` would."""
        self.now += ms


class FaultPlanError(ValueError):
    """A fault plan that cannot be used (``code``: ``invalid_fault_plan``)."""

    code = "invalid_fault_plan"

    def __init__(self, message: str) -> None:
        super().__init__(f"invalid_fault_plan: {message}")


class InjectedFault(Exception):
    """An injected failure with a status and headers (or a connection error's
    ``code``) like a real one's; the drivers read them as they read an SDK's."""

    def __init__(self, fault: Fault, status_code: Optional[int], headers: Dict[str, str], code: Optional[str] = None) -> None:
        what = f" (HTTP {status_code})" if status_code is not None else f" ({code})"
        super().__init__(f"injected fault: {fault['kind']}{what}")
        #: What was injected.
        self.fault = dict(fault)
        #: The HTTP status, for an HTTP failure.
        self.status_code = status_code
        #: Its headers, the injected-fault header among them.
        self.headers = headers
        #: The connection error's code (``ECONNRESET``, ``ETIMEDOUT``), for a connection failure.
        self.code = code


def _check(script: Sequence[Optional[Fault]], rates: Mapping[str, float], seed: int, latency_ms: int) -> None:
    total = 0.0
    for kind, rate in rates.items():
        if kind not in _RATED:
            raise FaultPlanError(f"unknown fault kind {kind!r}")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise FaultPlanError(f"rate of {kind} is {rate!r}, not in 0..1")
        total += rate
    if total > 1:
        raise FaultPlanError(f"rates add up to {total}, more than 1")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise FaultPlanError("seed is not an integer")
    if isinstance(latency_ms, bool) or not isinstance(latency_ms, int) or latency_ms < 0:
        raise FaultPlanError("latency_ms is not a non-negative integer")
    for f in script:
        if f is None:
            continue
        if f.get("kind") not in _KINDS:
            raise FaultPlanError(f"unknown fault kind {f.get('kind')!r}")
        if f["kind"] == "slow" and not (isinstance(f.get("ms"), int) and f["ms"] >= 0):
            raise FaultPlanError("a slow fault's ms is not a non-negative integer")


def _mulberry32(seed: int) -> Callable[[], float]:
    """The same small generator as the TypeScript kit's (mulberry32), uniform in
    [0, 1): the same seed injects the same faults in both packages (a test in
    each pins the same pattern)."""
    state = seed & 0xFFFFFFFF

    def draw() -> float:
        nonlocal state
        state = (state + 0x6D2B79F5) & 0xFFFFFFFF
        t = state
        t = ((t ^ (t >> 15)) * (t | 1)) & 0xFFFFFFFF
        t ^= (t + (((t ^ (t >> 7)) * (t | 61)) & 0xFFFFFFFF)) & 0xFFFFFFFF
        return ((t ^ (t >> 14)) & 0xFFFFFFFF) / 4_294_967_296

    return draw


class _Chooser:
    """Chooses the fault of each call, by script then by rate."""

    def __init__(
        self, script: Sequence[Optional[Fault]], rates: Mapping[str, float], seed: int, clock: Optional[FakeClock], latency_ms: int
    ) -> None:
        _check(script, rates, seed, latency_ms)
        self.script = list(script)
        self.rates = dict(rates)
        self.draw = _mulberry32(seed)
        self.clock = clock
        self.latency_ms = latency_ms
        self.calls = 0
        self.injected = 0

    def next(self) -> Optional[Fault]:
        i = self.calls
        self.calls += 1
        if i < len(self.script):
            return self.script[i]
        if not self.rates:
            return None
        x = self.draw()
        for kind in _RATED:
            r = self.rates.get(kind, 0.0)
            if x < r:
                return {"kind": kind}
            x -= r
        return None

    def failure(self, fault: Optional[Fault]) -> Optional[InjectedFault]:
        """The failure to raise for ``fault`` (counted, the clock advanced), or
        ``None`` to go on with the real call (a slow fault advances the clock)."""
        if fault is None:
            return None
        kind = fault["kind"]
        if kind == "slow":
            if self.clock is not None:
                self.clock.advance(fault["ms"])
            return None
        headers = {INJECTED_FAULT_HEADER: kind}
        status: Optional[int] = None
        code: Optional[str] = None
        if kind == "rate_limited":
            status = int(fault.get("status", 429))
            if "retry_after" in fault:
                headers["retry-after"] = str(fault["retry_after"])
            if "retry_after_ms" in fault:
                headers["retry-after-ms"] = str(fault["retry_after_ms"])
        elif kind == "unavailable":
            status = int(fault.get("status", 503))
            if "retry_after_ms" in fault:
                headers["retry-after-ms"] = str(fault["retry_after_ms"])
        elif kind == "overloaded":
            status = 529
        elif kind == "timeout":
            code = "ETIMEDOUT"
        else:
            code = "ECONNRESET"
        self.injected += 1
        if self.clock is not None:
            self.clock.advance(self.latency_ms)
        return InjectedFault(fault, status, headers, code)


class _Faulty:
    """A dispatch function with faults injected before the real one runs."""

    def __init__(self, dispatch: Callable[..., Any], chooser: _Chooser) -> None:
        self._dispatch = dispatch
        self._chooser = chooser
        self._async = inspect.iscoroutinefunction(dispatch)

    @property
    def injected(self) -> int:
        """How many failures were injected so far."""
        return self._chooser.injected

    def __call__(self, step: Any) -> Any:
        failure = self._chooser.failure(self._chooser.next())
        if self._async:
            return self._call_async(step, failure)
        if failure is not None:
            raise failure
        return self._dispatch(step)

    async def _call_async(self, step: Any, failure: Optional[InjectedFault]) -> Any:
        if failure is not None:
            raise failure
        return await self._dispatch(step)


def inject_faults(
    dispatch: Callable[[Any], Any],
    *,
    script: Sequence[Optional[Fault]] = (),
    rates: Optional[Mapping[str, float]] = None,
    seed: int = 1,
    clock: Optional[FakeClock] = None,
    latency_ms: int = 0,
) -> Any:
    """``dispatch`` (sync or async) with faults injected: the first calls by
    ``script`` (``None`` lets a call through), later ones at random by
    ``rates`` (each 0..1, adding up to at most 1; seeded, so the same seed
    injects the same faults). A failing fault raises :class:`InjectedFault`
    instead of calling ``dispatch`` (after ``latency_ms`` on ``clock``); a
    ``slow`` fault advances ``clock`` by its ``ms``, then calls ``dispatch``.
    The wrapper's ``injected`` counts the failures. Raises
    :class:`FaultPlanError` for a plan that cannot be used."""
    return _Faulty(dispatch, _Chooser(script, rates or {}, seed, clock, latency_ms))
