"""Journal-backed runs in one process: the same bundle as the plain driver,
the durable order of events, takeover, the coded refusals."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any, Dict, List

import pytest

import retryledger
from retryledger.journal import journal_verify
from retryledger.journaled import (
    JournaledRunError,
    JournaledStopError,
    JournalStep,
    LeaseLostError,
    RunExistsError,
    RunNotFoundError,
    journal_log,
    lease_key,
    resume,
    resume_async,
    run_journaled,
    run_journaled_async,
)
from retryledger.stores import MemoryStore

from conftest import KEY, ROOT, FakeClock, make_policy

T0 = 1_780_000_000_000


def scripted(clock: FakeClock, statuses: Dict[int, int], sent: List[int]) -> Any:
    def dispatch(step: Any) -> str:
        sent.append(step.ordinal)
        clock.advance(100)
        status = statuses[step.ordinal]
        if status == 200:
            step.charge(step.reserve_cost)
            return "ok"
        step.charge(0)
        if status == 429:
            raise retryledger.AttemptError.retryable("rate_limited", retry_after_ms=250)
        raise retryledger.AttemptError.retryable("unavailable")

    return dispatch


def test_a_journaled_run_seals_the_plain_drivers_bundle() -> None:
    policy = retryledger.Policy(make_policy())
    statuses = {1: 429, 2: 503, 3: 200}
    clock = FakeClock()
    plain = retryledger.run(policy, scripted(clock, statuses, []), KEY, clock=clock, sleep=clock.sleep)
    clock = FakeClock()
    clock.now = T0
    store = MemoryStore()
    kinds: List[str] = []
    result = run_journaled(
        policy,
        scripted(clock, statuses, []),
        KEY,
        store=store,
        run_id="r-1",
        clock=clock,
        sleep=clock.sleep,
        on_append=lambda e: kinds.append(e["kind"]),
    )
    assert result.bundle_json == plain.bundle_json
    assert result.value == "ok" and result.reconciled == []
    assert kinds == ["created", "decided"] + ["reserved", "dispatched", "observed", "decided"] * 3 + ["terminal"]
    events = [e.text for e in store.read(journal_log("r-1"))]
    assert len(events) == 15
    assert journal_verify(policy, result.events)["terminal"] == "completed"
    assert result.events[-1]["receipt_sha256"] == result.receipt_sha256
    # A second run under the same id is refused; resuming a finished run seals it again.
    with pytest.raises(RunExistsError) as info:
        run_journaled(policy, scripted(clock, statuses, []), KEY, store=store, run_id="r-1", clock=clock)
    assert info.value.code == "run_exists"
    again = resume(policy, scripted(clock, statuses, []), KEY, store=store, run_id="r-1", clock=clock)
    assert again.receipt_sha256 == result.receipt_sha256 and again.lease_generation == 2
    assert len(store.read(journal_log("r-1"))) == 15


def test_the_dispatched_event_is_durable_before_the_call() -> None:
    policy = retryledger.Policy(make_policy())
    store = MemoryStore()
    clock = FakeClock()
    clock.now = T0
    seen: List[str] = []

    def dispatch(step: JournalStep) -> str:
        seen.append(store.read(journal_log("r-2"))[-1].text)
        return "ok"

    run_journaled(policy, dispatch, KEY, store=store, run_id="r-2", clock=clock, sleep=clock.sleep)
    assert '"kind":"dispatched"' in seen[0]


def test_an_unknown_answer_stops_indeterminate_and_nothing_is_resent() -> None:
    policy = retryledger.Policy(make_policy())
    store = MemoryStore()
    clock = FakeClock()
    clock.now = T0
    sent: List[int] = []

    def crash(step: JournalStep) -> str:
        raise KeyboardInterrupt  # the process dies with the attempt in flight

    with pytest.raises(KeyboardInterrupt):
        run_journaled(policy, crash, KEY, store=store, run_id="r-3", clock=clock, sleep=clock.sleep)
    with pytest.raises(JournaledRunError) as missing:
        resume(policy, scripted(clock, {}, sent), KEY, store=store, run_id="r-3", clock=clock, sleep=clock.sleep)
    assert missing.value.code == "reconcile_missing"
    asked: List[Dict[str, Any]] = []

    def reconcile(attempt: Dict[str, Any]) -> str:
        asked.append(attempt)
        return "in_progress"

    with pytest.raises(JournaledStopError) as stop:
        resume(
            policy,
            scripted(clock, {}, sent),
            KEY,
            store=store,
            run_id="r-3",
            clock=clock,
            sleep=clock.sleep,
            reconcile=reconcile,
            max_polls=3,
        )
    assert stop.value.code == "stop_indeterminate" and stop.value.reconciled == [1]
    assert len(asked) == 3 and asked[0]["idempotency_key"] == KEY
    assert sent == []


def test_failed_no_effect_permits_a_new_dispatch() -> None:
    policy = retryledger.Policy(make_policy())
    store = MemoryStore()
    clock = FakeClock()
    clock.now = T0

    def crash(step: JournalStep) -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_journaled(policy, crash, KEY, store=store, run_id="r-4", clock=clock, sleep=clock.sleep)
    sent: List[int] = []
    result = resume(
        policy,
        scripted(clock, {2: 200}, sent),
        KEY,
        store=store,
        run_id="r-4",
        clock=clock,
        sleep=clock.sleep,
        reconcile=lambda a: {"answer": "failed_no_effect", "cost": 0},
    )
    assert sent == [2] and result.reconciled == [1] and result.terminal == "completed"


def test_a_taken_over_owner_stops_without_writing() -> None:
    policy = retryledger.Policy(make_policy())
    store = MemoryStore()
    clock = FakeClock()
    clock.now = T0

    def taken_over(step: JournalStep) -> str:
        # Another owner raises the lease while this one is in its call.
        _, g = store.get(lease_key("r-5"))
        assert store.compare_and_set(lease_key("r-5"), g, {"lease_generation": g + 1})[0]
        return "ok"

    with pytest.raises(LeaseLostError) as info:
        run_journaled(policy, taken_over, KEY, store=store, run_id="r-5", clock=clock, sleep=clock.sleep)
    assert info.value.code == "lease_lost" and info.value.seq == 4
    assert info.value.event is not None and info.value.event["kind"] == "observed"
    assert len(store.read(journal_log("r-5"))) == 4


def test_resume_of_nothing_and_a_tampered_journal_are_coded() -> None:
    policy = retryledger.Policy(make_policy())
    store = MemoryStore()
    with pytest.raises(RunNotFoundError) as info:
        resume(policy, lambda s: "ok", KEY, store=store, run_id="absent")
    assert info.value.code == "run_not_found"
    assert store.get(lease_key("absent")) == (None, 0), "nothing written"
    store.append(journal_log("bad"), 0, '{"kind":"created"}')
    with pytest.raises(retryledger.RetryledgerError) as bad:
        resume(policy, lambda s: "ok", KEY, store=store, run_id="bad")
    assert bad.value.code == "missing_field"
    with pytest.raises(retryledger.DriftError):
        run_journaled(policy, lambda s: "ok", "another key", store=store, run_id="k")
    with pytest.raises(retryledger.DecodeError) as polls:
        resume(policy, lambda s: "ok", KEY, store=store, run_id="k", max_polls=0)
    assert (polls.value.code, polls.value.path) == ("invalid_value", "/max_polls")


def test_usage_and_the_request_body_are_recorded_and_survive_a_takeover() -> None:
    """The step is the plain driver's, on the core's session resumed from the
    journal: usage is priced by the schedule, the body sent is recorded, and
    after a crash the new owner's attempts keep both rules (the same body on
    a retry of the route)."""
    from test_price import POLICY, PRIMARY, SCHEDULE

    store = MemoryStore()
    clock = FakeClock()
    clock.now = T0
    body = b'{"input":"summarize"}'
    usage = {"input": 1000, "output": 500}

    def first(step: JournalStep) -> str:
        step.request_body(body)
        step.usage(usage)
        clock.advance(50)
        if step.ordinal == 1:
            raise retryledger.AttemptError.retryable("unavailable")
        raise KeyboardInterrupt  # the process dies with attempt 2 in flight

    with pytest.raises(KeyboardInterrupt):
        run_journaled(POLICY, first, KEY, store=store, run_id="u-1", clock=clock, sleep=clock.sleep, price_schedule=SCHEDULE)

    def second(step: JournalStep) -> str:
        step.request_body(body)
        step.usage(usage)
        return "ok"

    result = resume(
        POLICY,
        second,
        KEY,
        store=store,
        run_id="u-1",
        clock=clock,
        sleep=clock.sleep,
        price_schedule=SCHEDULE,
        reconcile=lambda a: {"answer": "failed_no_effect", "cost": 0},
    )
    attempts = result.bundle["attempts"]["attempts"]
    assert [a["ordinal"] for a in attempts] == [1, 2, 3] and result.reconciled == [2]
    for a in (attempts[0], attempts[2]):
        assert a["usage"] == usage
        assert a["cost"] == retryledger.price_cost(SCHEDULE, a["route_release_sha256"], usage)
    assert attempts[0]["route_release_sha256"] == PRIMARY
    digest = hashlib.sha256(body).hexdigest()
    assert attempts[0]["request_body_sha256"] == digest == attempts[2]["request_body_sha256"]
    assert "request_body_sha256" not in attempts[1]  # reconciled: the receiver's answer, not a send
    assert result.bundle["price_schedule"] == SCHEDULE
    assert retryledger.verify_bundle(result.bundle)["kind"] == "verified"

    # Another body on the retry of the route is the core's drift, as in the plain driver.
    store = MemoryStore()

    def drifting(step: JournalStep) -> str:
        step.request_body(body if step.ordinal == 1 else body + b" ")
        raise retryledger.AttemptError.retryable("unavailable")

    with pytest.raises(retryledger.RetryledgerError) as drift:
        run_journaled(POLICY, drifting, KEY, store=store, run_id="u-2", clock=clock, sleep=clock.sleep)
    assert drift.value.code == "request_body_drift"


@pytest.mark.parametrize(
    "section, code", [("fleet", "admission_missing"), ("stream", "invalid_stream_contract"), ("job", "invalid_async_job")]
)
def test_a_policy_a_journal_cannot_carry_is_refused_before_anything_is_written(section: str, code: str) -> None:
    vectors = json.loads((ROOT / f"tests/vectors/{section}.json").read_text())["cases"]
    policy = next(json.loads(c["input"]["policy"]) for c in vectors if "policy" in c["input"])
    store = MemoryStore()
    with pytest.raises(retryledger.RetryledgerError) as info:
        run_journaled(policy, lambda s: "ok", KEY, store=store, run_id="p-1")
    assert info.value.code == code
    assert store.read(journal_log("p-1")) == [] and store.get(lease_key("p-1"))[1] == 0


def test_the_async_entry_points_seal_the_same_bundle_and_a_cancelled_attempt_stays_in_doubt() -> None:
    policy = retryledger.Policy(make_policy())
    statuses = {1: 429, 2: 503, 3: 200}
    clock = FakeClock()
    clock.now = T0
    sync = run_journaled(policy, scripted(clock, statuses, []), KEY, store=MemoryStore(), run_id="a-1", clock=clock, sleep=clock.sleep)

    async def main() -> None:
        clock = FakeClock()
        clock.now = T0
        plain = scripted(clock, statuses, [])

        async def dispatch(step: JournalStep) -> str:
            await asyncio.sleep(0)
            return str(plain(step))

        async def sleep(ms: float) -> None:
            clock.sleep(ms)

        result = await run_journaled_async(policy, dispatch, KEY, store=MemoryStore(), run_id="a-1", clock=clock, sleep=sleep)
        assert result.bundle_json == sync.bundle_json and result.value == "ok"

        # A task cancelled with its first attempt in flight: the journal holds
        # `dispatched` and no observation; the new owner asks the receiver
        # (an async reconcile) and dispatches again only on failed_no_effect.
        store = MemoryStore()
        started = asyncio.Event()

        async def hangs(step: JournalStep) -> str:
            started.set()
            await asyncio.Event().wait()
            return "never"

        task = asyncio.ensure_future(run_journaled_async(policy, hangs, KEY, store=store, run_id="a-2", clock=clock, sleep=sleep))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert json.loads(store.read(journal_log("a-2"))[-1].text)["kind"] == "dispatched"
        asked: List[int] = []

        async def reconcile(attempt: Dict[str, Any]) -> Dict[str, Any]:
            asked.append(attempt["ordinal"])
            return {"answer": "failed_no_effect", "cost": 0}

        sent: List[int] = []
        again = scripted(clock, {2: 200}, sent)

        async def dispatch_again(step: JournalStep) -> str:
            return str(again(step))

        done = await resume_async(policy, dispatch_again, KEY, store=store, run_id="a-2", clock=clock, sleep=sleep, reconcile=reconcile)
        assert asked == [1] and sent == [2] and done.reconciled == [1] and done.terminal == "completed"

    asyncio.run(main())


@pytest.mark.parametrize("entry", ["resume", "run_journaled", "resume_async", "run_journaled_async"])
def test_a_run_claimed_but_never_created_is_started_by_either_entry_point(entry: str) -> None:
    """Its owner died between the lease claim and ``created``: nothing was sent.
    Each entry point takes the lease over and starts the run from the
    beginning; the run ends with the uncrashed run's receipt."""
    policy = retryledger.Policy(make_policy())
    statuses = {1: 429, 2: 503, 3: 200}
    clock = FakeClock()
    clock.now = T0
    base = run_journaled(policy, scripted(clock, statuses, []), KEY, store=MemoryStore(), run_id="base", clock=clock, sleep=clock.sleep)
    store = MemoryStore()
    assert store.compare_and_set(lease_key("r-claimed"), 0, {"run_id": "r-claimed", "lease_generation": 1})[0]
    clock = FakeClock()
    clock.now = T0
    sent: List[int] = []
    kwargs: Dict[str, Any] = dict(store=store, run_id="r-claimed", clock=clock)
    if entry == "resume":
        result = resume(policy, scripted(clock, statuses, sent), KEY, sleep=clock.sleep, **kwargs)
    elif entry == "run_journaled":
        result = run_journaled(policy, scripted(clock, statuses, sent), KEY, sleep=clock.sleep, **kwargs)
    else:
        step = scripted(clock, statuses, sent)

        async def dispatch(s: Any) -> str:
            return str(step(s))

        async def sleep(ms: float) -> None:
            clock.sleep(ms)

        chosen = resume_async if entry == "resume_async" else run_journaled_async
        result = asyncio.run(chosen(policy, dispatch, KEY, sleep=sleep, **kwargs))
    assert result.terminal == "completed" and sent == [1, 2, 3]
    assert result.lease_generation == 2 and store.get(lease_key("r-claimed"))[1] == 2
    assert result.events[0]["kind"] == "created" and result.events[0]["lease_generation"] == 2
    assert result.receipt_sha256 == base.receipt_sha256
    assert journal_verify(policy, result.events)["terminal"] == "completed"
    # The run now exists: a second run_journaled is refused as before.
    with pytest.raises(RunExistsError):
        run_journaled(policy, scripted(clock, statuses, []), KEY, store=store, run_id="r-claimed", clock=clock)


def test_a_slow_owner_whose_claimed_run_was_taken_over_is_fenced() -> None:
    """The first owner claimed, then a second one took the empty run over and
    started it: the first owner's ``created`` is refused (lease_lost)."""
    policy = retryledger.Policy(make_policy())
    store = MemoryStore()
    clock = FakeClock()
    clock.now = T0

    class Slow:
        """The store, but another owner takes the run over (and finishes it)
        between the first owner's look at the empty journal and its ``created``."""

        def __init__(self) -> None:
            self.once = True

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def read(self, log: str, start: int = 0) -> Any:
            held = store.read(log, start)
            if self.once:
                self.once = False
                run_journaled(policy, scripted(clock, {1: 200}, []), KEY, store=store, run_id="r-slow", clock=clock, sleep=clock.sleep)
            return held

    with pytest.raises(LeaseLostError) as info:
        run_journaled(policy, scripted(clock, {1: 200}, []), KEY, store=Slow(), run_id="r-slow", clock=clock, sleep=clock.sleep)
    assert info.value.code == "lease_lost" and info.value.seq == 0
    held = [json.loads(e.text) for e in store.read(journal_log("r-slow"))]
    assert held[0]["lease_generation"] == 2 and held[-1]["kind"] == "terminal"
