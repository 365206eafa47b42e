"""The driver vectors (tests/vectors/drivers.json, read in place): every case
replayed through ``run`` (the cases a host that cannot cancel can run) and
``run_async`` (all of them) with a fake clock, a fake sleep and a scripted
dispatch, as docs/HOSTS.md ("Driver vectors") specifies. Both drivers must give
the expected sleeps, attempts document, receipt digest, terminal, judging
rules, result, and error class and code."""

from __future__ import annotations

import asyncio
import copy
import json
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

import retryledger
import retryledger.checks
from retryledger import AttemptError, Step

from conftest import ROOT

DRIVERS = ROOT / "tests" / "vectors" / "drivers.json"
#: The drive cases with an output check live with the other output-check vectors.
REPAIR = ROOT / "tests" / "vectors" / "repair.json"

#: What the run's output check answers on a step without a ``verdict``.
PASS = {"kind": "schema", "validator": "script", "verdict": "pass"}


def _load() -> List[Dict[str, Any]]:
    doc = json.loads(DRIVERS.read_text(encoding="utf-8"))
    assert doc["schema"] == "retryledger.vectors.v1"
    cases: List[Dict[str, Any]] = doc["cases"]
    assert all(c["op"] == "drive" for c in cases)
    repair = json.loads(REPAIR.read_text(encoding="utf-8"))
    return cases + [c for c in repair["cases"] if c["op"] == "drive"]


CASES = _load()
SYNC_CASES = [c for c in CASES if not c["input"]["cancellable"]]


def build_error(spec: Dict[str, Any]) -> BaseException:
    """An exception as the case describes it: classes named along ``types``
    (each a subclass of the next, the last of ``Exception``), ``status_code``,
    ``response.headers``, ``body``, ``code``; or an ``AttemptError`` with an outcome."""
    if "outcome" in spec:
        return AttemptError(spec["outcome"])
    cls: type = Exception
    for name in reversed(spec["types"]):
        cls = type(name, (cls,), {})
    exc: BaseException = cls(f"scripted {spec['types'][0]}")
    if "status" in spec:
        setattr(exc, "status_code", spec["status"])
    if "headers" in spec:
        setattr(exc, "response", SimpleNamespace(headers={k: v for k, v in spec["headers"]}))
    if "body" in spec:
        setattr(exc, "body", spec["body"])
    if "code" in spec:
        setattr(exc, "code", spec["code"])
    return exc


def chained(spec: Dict[str, Any]) -> BaseException:
    """The error with its ``__cause__`` chain."""
    exc = build_error(spec)
    if "cause" in spec:
        exc.__cause__ = chained(spec["cause"])
    return exc


def raise_error(spec: Dict[str, Any]) -> None:
    exc = build_error(spec)
    if "cause" in spec:
        raise exc from chained(spec["cause"])
    raise exc


class Script:
    """The fake clock, the fake sleeps and the scripted dispatch of one case."""

    def __init__(self, case: Dict[str, Any]) -> None:
        self.steps: List[Dict[str, Any]] = case["input"]["script"]
        self.now = 0
        self.index = 0
        self.sleeps: List[float] = []
        #: What the run's output check answers on the last result (a step's ``verdict``).
        self.verdict: Dict[str, Any] = PASS

    def clock(self) -> float:
        return float(self.now)

    def _upcoming(self) -> Dict[str, Any]:
        return self.steps[self.index] if self.index < len(self.steps) else {}

    def sleep(self, ms: float) -> None:
        self.sleeps.append(ms)
        upcoming = self._upcoming()
        assert not upcoming.get("cancel_before"), "a sync host cannot cancel"
        self.now += int(ms) + upcoming.get("sleep_overshoot_ms", 0)

    async def async_sleep(self, ms: float) -> None:
        self.sleeps.append(ms)
        upcoming = self._upcoming()
        if upcoming.get("cancel_before"):
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
            raise AssertionError("the cancellation did not arrive")
        self.now += int(ms) + upcoming.get("sleep_overshoot_ms", 0)

    def _begin(self, step: Step) -> Dict[str, Any]:
        assert self.index < len(self.steps), "dispatched more often than scripted"
        s = self.steps[self.index]
        assert not s.get("cancel_before"), "dispatched where the caller cancels before"
        self.index += 1
        self.now += s.get("duration_ms", 0)
        self.verdict = s.get("verdict", PASS)
        for n in s.get("charge", []):
            step.charge(n)
        if s.get("output_delivered"):
            step.output_delivered()
        return s

    @staticmethod
    def _end(s: Dict[str, Any]) -> str:
        if "raises" in s:
            raise_error(s["raises"])
        value: str = s["returns"]
        return value

    def checks(self) -> Optional[List[Any]]:
        """The run's output check, when the case scripts verdicts."""
        if not any("verdict" in s for s in self.steps):
            return None
        return [retryledger.checks.function(lambda output: self.verdict, validator="script")]

    def dispatch(self, step: Step) -> str:
        s = self._begin(step)
        assert not s.get("cancel_during"), "a sync host cannot cancel"
        return self._end(s)

    async def async_dispatch(self, step: Step) -> str:
        s = self._begin(step)
        if s.get("cancel_during"):
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
            raise AssertionError("the cancellation did not arrive")
        return self._end(s)


def classifier(case: Dict[str, Any]) -> Optional[Callable[[BaseException], Any]]:
    table = case["input"].get("classify")
    if table is None:
        return None
    return lambda exc: table.get(type(exc).__name__)


Observed = Dict[str, Any]


def observed(script: Script, rules: List[str], result: Any, error: Optional[BaseException]) -> Observed:
    """What a replay gave, in the shape of a case's ``expect``."""
    got: Observed = {"sleeps": list(script.sleeps), "rules": rules, "dispatches": script.index}
    sealed: Any = None
    if error is None:
        got["result"] = result.value
        sealed = result
    else:
        got["error"] = {"class": type(error).__name__, "code": getattr(error, "code", None)}
        if isinstance(error, (retryledger.RunStoppedError, retryledger.RunCancelledError)):
            sealed = error
    if sealed is not None:
        got["attempts"] = sealed.bundle["attempts"]
        got["receipt_sha256"] = sealed.receipt_sha256
        got["terminal"] = sealed.terminal
        got["verified"] = retryledger.verify_bundle(sealed.bundle_json)["kind"]
    return got


def check(case: Dict[str, Any], got: Observed) -> None:
    """Every expected field, compared (fails with AssertionError)."""
    expect = case["expect"]
    assert got["sleeps"] == expect["sleeps"], "sleeps"
    assert got["rules"] == expect.get("rules", []), "rules"
    if "attempts" in expect:
        assert got.get("attempts") == expect["attempts"], "attempts"
        assert got["dispatches"] == len(expect["attempts"]["attempts"]), "dispatch calls"
        assert got.get("verified") == "verified", "the bundle verifies"
    else:
        assert "attempts" not in got and got["dispatches"] == 0, "refused before dispatch"
    assert got.get("receipt_sha256") == expect.get("receipt_sha256"), "receipt_sha256"
    assert got.get("terminal") == expect.get("terminal"), "terminal"
    assert got.get("result") == expect.get("result"), "result"
    assert got.get("error") == expect.get("error"), "error class and code"


def replay_sync(case: Dict[str, Any]) -> Observed:
    script = Script(case)
    rules: List[str] = []
    inp = case["input"]
    result: Any = None
    error: Optional[BaseException] = None
    try:
        result = retryledger.run(
            inp["policy"],
            script.dispatch,
            inp["idempotency_key"],
            classify=classifier(case),
            clock=script.clock,
            sleep=script.sleep,
            wall_clock=lambda: float(inp["now_unix_ms"]),
            on_attempt=lambda attempt, judgement: rules.append(judgement.rule),
            checks=script.checks(),
        )
    except retryledger.RetryledgerError as e:
        error = e
    return observed(script, rules, result, error)


def replay_async(case: Dict[str, Any]) -> Observed:
    script = Script(case)
    rules: List[str] = []
    inp = case["input"]
    cancelled: List[retryledger.RunCancelledError] = []

    async def main() -> Tuple[Any, Optional[BaseException]]:
        task = asyncio.ensure_future(
            retryledger.run_async(
                inp["policy"],
                script.async_dispatch,
                inp["idempotency_key"],
                classify=classifier(case),
                clock=script.clock,
                sleep=script.async_sleep,
                wall_clock=lambda: float(inp["now_unix_ms"]),
                on_attempt=lambda attempt, judgement: rules.append(judgement.rule),
                on_cancel=cancelled.append,
                checks=script.checks(),
            )
        )
        try:
            return await task, None
        except retryledger.RetryledgerError as e:
            return None, e
        except asyncio.CancelledError:
            assert len(cancelled) == 1, "on_cancel saw the cancellation once"
            return None, cancelled[0]

    result, error = asyncio.run(main())
    return observed(script, rules, result, error)


def test_driver_vectors_are_present() -> None:
    assert len(CASES) >= 40
    assert SYNC_CASES and len(SYNC_CASES) < len(CASES)


@pytest.mark.parametrize("case", SYNC_CASES, ids=[c["name"] for c in SYNC_CASES])
def test_run_replays_the_case(case: Dict[str, Any]) -> None:
    check(case, replay_sync(case))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_run_async_replays_the_case(case: Dict[str, Any]) -> None:
    check(case, replay_async(case))


def _mutations(case: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    """One changed expected field at a time."""
    changed: List[Tuple[str, Dict[str, Any]]] = []

    def mutate(name: str, edit: Callable[[Dict[str, Any]], None]) -> None:
        c = copy.deepcopy(case)
        edit(c["expect"])
        changed.append((name, c))

    mutate("sleeps", lambda e: e.__setitem__("sleeps", e["sleeps"] + [1]))
    mutate("rules", lambda e: e.__setitem__("rules", list(reversed(e.get("rules", []))) + ["returned"]))
    if "attempts" in case["expect"]:
        mutate(
            "attempts",
            lambda e: e["attempts"]["attempts"][-1].__setitem__(
                "cost", e["attempts"]["attempts"][-1]["cost"] + 1
            ),
        )
        mutate("receipt_sha256", lambda e: e.__setitem__("receipt_sha256", "0" * 64))
        mutate("terminal", lambda e: e.__setitem__("terminal", "stop_cancelled" if e["terminal"] != "stop_cancelled" else "completed"))
    if "result" in case["expect"]:
        mutate("result", lambda e: e.__setitem__("result", e["result"] + "!"))
    if "error" in case["expect"]:
        mutate("error class", lambda e: e["error"].__setitem__("class", "RetryledgerError"))
        mutate("error code", lambda e: e["error"].__setitem__("code", e["error"]["code"] + "_x"))
    return changed


@pytest.mark.parametrize(
    "name",
    ["driver_reference_run", "driver_unknown_exception_never_retried", "driver_cancel_during_second_attempt", "driver_wrong_idempotency_key_refused"],
)
def test_a_changed_expectation_fails(name: str) -> None:
    (case,) = [c for c in CASES if c["name"] == name]
    got = replay_async(case)
    check(case, got)
    mutations = _mutations(case)
    assert len(mutations) >= 4
    for field, changed in mutations:
        with pytest.raises(AssertionError):
            check(changed, got)
