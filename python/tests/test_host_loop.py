"""The host loop over the core's run machine (retryledger._loop): a plain
run reaches the receipt the plain driver reaches on the same outcomes; a
fleet run and a journaled run replay to the same effects and digests
through ``machine_transcript``; a journaled run crashed after any append is
resumed to a verified end; both pumps; refusals are coded."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List, Mapping, Optional

import pytest

import retryledger
from retryledger import AttemptError, DecodeError, RetryledgerError, RunStoppedError, Step
from retryledger._loop import Adapter, LoopResult, Machine, pump, pump_async, run_loop, store_read, store_write
from retryledger.stores import MemoryStore

from conftest import KEY, FakeClock, make_policy
from fleet_support import BREAKER, fleet_policy

EPOCH = 1_780_000_000_000


class Scripted(Adapter):
    """An adapter over a fake clock: each attempt takes ``took`` ms and fails
    as ``script`` says (``None``: returns ``"ok"``); every event the loop
    answered with is recorded, for a replay."""

    def __init__(self, script: List[Optional[str]], took: int = 100, store: Any = None, log: Optional[List[Dict[str, Any]]] = None) -> None:
        self.clock = FakeClock()
        self.script = list(script)
        self.took = took
        self.store = store
        self.log = log
        self.sent: List[int] = []
        self.hooks: List[str] = []
        self.crash_after: Optional[int] = None
        self.answers: List[str] = []

    def now_ms(self) -> int:
        return int(self.clock.now)

    def sleep(self, ms: int) -> None:
        self.clock.sleep(ms)

    def dispatch(self, effect: Dict[str, Any]) -> Any:
        self.sent.append(int(effect["dispatch"]["ordinal"]))
        self.clock.advance(self.took)
        fault = self.script.pop(0) if self.script else None
        if fault is not None:
            raise AttemptError.retryable(fault)  # type: ignore[arg-type]
        return "ok"

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        if ok:
            return {}
        assert isinstance(reply, AttemptError)
        return {"facts": reply._facts.to_dict()}

    def read(self, keys: List[str]) -> List[Dict[str, Any]]:
        return store_read(self.store, self.namespace, keys)

    def write(self, writes: List[Dict[str, Any]]) -> int:
        return store_write(self.store, self.namespace, writes)

    def append(self, events: List[Dict[str, Any]]) -> bool:
        assert self.log is not None
        if self.crash_after is not None and len(self.log) + len(events) > self.crash_after:
            # Some of the write lands, as a crash between two events would leave it.
            self.log.extend(events[: max(0, self.crash_after - len(self.log))])
            raise KeyboardInterrupt("crashed")
        self.log.extend(events)
        return True

    def reconcile(self, attempt: Dict[str, Any], poll: int) -> Mapping[str, Any]:
        return {"answer": self.answers.pop(0) if self.answers else "failed_no_effect"}

    def on_decision(self, decision: Dict[str, Any]) -> None:
        self.hooks.append(f"decision:{decision['kind']}")

    def on_sleep(self, sleep: Dict[str, Any]) -> None:
        self.hooks.append(f"sleep:{sleep['ms']}")

    def on_attempt(self, attempt: Dict[str, Any], judgement: Dict[str, Any]) -> None:
        self.hooks.append(f"attempt:{attempt['ordinal']}:{judgement['rule']}")

    def on_terminal(self, receipt: Dict[str, Any]) -> None:
        self.hooks.append(f"terminal:{receipt['terminal']}")


class Recording(Machine):
    """A machine that keeps every event it was answered with."""

    def __init__(self, inner: Machine) -> None:
        super().__init__(inner._m)
        self.events: List[Dict[str, Any]] = []

    def answer(self, event: Mapping[str, Any]) -> Dict[str, Any]:
        self.events.append(dict(event))
        return super().answer(event)


def verified(bundle: Dict[str, Any]) -> bool:
    return bool(retryledger.verify_bundle(json.dumps(bundle))["kind"] == "verified")


def plain_driver(script: List[Optional[str]], policy: Dict[str, Any]) -> Any:
    clock = FakeClock()
    faults = list(script)

    def dispatch(step: Step) -> str:
        clock.advance(100)
        fault = faults.pop(0) if faults else None
        if fault is not None:
            raise AttemptError.retryable(fault)  # type: ignore[arg-type]
        return "ok"

    try:
        return retryledger.run(retryledger.Policy(policy), dispatch, KEY, clock=clock, sleep=clock.sleep)
    except RunStoppedError as e:
        return e


@pytest.mark.parametrize(
    "script",
    [[None], ["rate_limited", None], ["unavailable", "unavailable", None], ["unavailable"] * 4],
)
def test_a_plain_run_reaches_the_plain_drivers_receipt(script: List[Optional[str]]) -> None:
    policy = make_policy()
    adapter = Scripted(script)
    result = pump(run_loop(Machine.start(policy, {"origin_epoch_ms": EPOCH}), adapter), adapter)
    assert isinstance(result, LoopResult)
    expected = plain_driver(script, policy)
    assert result.terminal == expected.terminal
    assert result.receipt_sha256 == expected.receipt_sha256
    assert result.receipt == expected.receipt
    assert verified(result.bundle)
    assert result.value == ("ok" if result.terminal == "completed" else None)
    attempts = len(result.bundle["attempts"]["attempts"])
    assert adapter.sent == list(range(1, attempts + 1))
    assert adapter.hooks[-1] == f"terminal:{result.terminal}"
    assert sum(h.startswith("attempt:") for h in adapter.hooks) == attempts


def test_the_async_pump_drives_the_same_run() -> None:
    policy = make_policy()

    class Async(Scripted):
        async def sleep(self, ms: int) -> None:  # type: ignore[override]
            await asyncio.sleep(0)
            self.clock.sleep(ms)

        async def dispatch(self, effect: Dict[str, Any]) -> Any:
            await asyncio.sleep(0)
            return Scripted.dispatch(self, effect)

    sync = Scripted(["rate_limited", None])
    asynced = Async(["rate_limited", None])
    a = pump(run_loop(Machine.start(policy, {"origin_epoch_ms": EPOCH}), sync), sync)
    b = asyncio.run(pump_async(run_loop(Machine.start(policy, {"origin_epoch_ms": EPOCH}), asynced), asynced))
    assert a.receipt_sha256 == b.receipt_sha256
    assert sync.hooks == asynced.hooks


def test_a_fleet_run_replays_to_the_same_effects_and_digests() -> None:
    policy = fleet_policy(breaker=BREAKER)
    store = MemoryStore()
    adapter = Scripted(["unavailable", "unavailable", None], store=store)
    machine = Recording(Machine.start(policy, {"origin_epoch_ms": EPOCH}))
    result = pump(run_loop(machine, adapter), adapter)
    assert result.terminal == "completed"
    assert verified(result.bundle)
    assert all("admission" in a for a in result.bundle["attempts"]["attempts"])
    # The breaker the run opened is in the store, under the namespace.
    release = result.bundle["attempts"]["attempts"][0]["route_release_sha256"]
    snapshot, generation = store.get(f"retryledger/breaker/{release}")
    assert snapshot is not None and snapshot["state"] == "open" and generation > 0
    replay = retryledger.machine_transcript(policy, {"origin_epoch_ms": EPOCH}, None, machine.events)
    assert "error" not in replay
    assert replay["receipt_sha256"] == result.receipt_sha256
    kinds = {e["kind"] for e in replay["effects"]}
    assert {"read", "write", "sleep", "dispatch", "done"} <= kinds


def journaled(adapter: Scripted, policy: Dict[str, Any], events: Optional[List[Dict[str, Any]]] = None) -> LoopResult:
    options: Dict[str, Any] = {"origin_epoch_ms": EPOCH, "journal": {"run_id": "run-1", "lease_generation": 1}}
    if events is None:
        machine = Machine.start(policy, options)
    else:
        options["journal"]["lease_generation"] = 2
        options["now_ms"] = adapter.now_ms()
        machine = Machine.resume(policy, options, events)
    return pump(run_loop(machine, adapter), adapter)


def test_a_journaled_run_writes_a_journal_that_verifies() -> None:
    policy = make_policy()
    log: List[Dict[str, Any]] = []
    adapter = Scripted(["rate_limited", None], log=log)
    result = journaled(adapter, policy)
    assert result.terminal == "completed"
    verdict = retryledger.journal_verify(policy, log)
    assert verdict["terminal"] == "completed" and verdict["next_seq"] == len(log)
    assert log[-1]["kind"] == "terminal" and log[-1]["receipt_sha256"] == result.receipt_sha256


def test_a_journaled_run_crashed_after_any_append_resumes_to_a_verified_end() -> None:
    policy = make_policy()
    whole: List[Dict[str, Any]] = []
    journaled(Scripted(["rate_limited", None], log=whole), policy)
    for n in range(len(whole)):
        log: List[Dict[str, Any]] = []
        first = Scripted(["rate_limited", None], log=log)
        first.crash_after = n
        with pytest.raises(KeyboardInterrupt):
            journaled(first, policy)
        assert len(log) == n
        # The new owner: the same outcomes from where the first stopped.
        done = sum(1 for e in log if e["kind"] == "observed")
        second = Scripted(["rate_limited", None][done:], log=log)
        second.clock.now = first.clock.now
        result = journaled(second, policy, list(log))
        assert result.terminal == "completed", n
        assert retryledger.journal_verify(policy, log)["terminal"] == "completed"
        # An attempt in doubt is sent again only after failed_no_effect (the answer given here).
        assert len(first.sent) + len(second.sent) <= 3


def test_an_unknown_effect_is_a_coded_error() -> None:
    class Odd(Machine):
        def __init__(self) -> None:
            pass

        def next(self) -> Dict[str, Any]:
            return {"kind": "teleport"}

    with pytest.raises(DecodeError) as e:
        pump(run_loop(Odd(), Scripted([])), Scripted([]))
    assert e.value.code == "invalid_value" and e.value.path == "/kind"


def test_a_refused_event_is_the_cores_coded_error() -> None:
    machine = Machine.start(make_policy(), {"origin_epoch_ms": EPOCH})
    assert machine.next()["kind"] == "dispatch"
    with pytest.raises(RetryledgerError) as e:
        machine.answer({"kind": "clock", "now_ms": 5})
    assert e.value.code == "unexpected_event"
    # The same effect is still outstanding.
    assert machine.next()["kind"] == "dispatch"


def test_a_fleet_policy_without_a_store_is_a_coded_error() -> None:
    adapter = Scripted([None])
    adapter.read = Adapter.read.__get__(adapter)  # type: ignore[method-assign]
    with pytest.raises(DecodeError) as e:
        pump(run_loop(Machine.start(fleet_policy(breaker=BREAKER), {"origin_epoch_ms": EPOCH}), adapter), adapter)
    assert e.value.code == "missing_field" and e.value.path == "/fleet"
