"""Journaled runs under a fleet, with the hooks of every driver: each
attempt admitted through the fleet store before its ``dispatched`` event,
its outcome written to its breaker after; a run crashed mid-way and resumed
admits again under its fleet; tenant shares name the call's tenant; a fleet
section without a fleet is refused before anything is claimed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

import retryledger
from retryledger.fleet import Fleet
from retryledger.journal import journal_verify
from retryledger.journaled import JournalStep, journal_log, lease_key, resume, run_journaled, run_journaled_async
from retryledger.stores import MemoryStore, SQLiteStore

from conftest import KEY, FakeClock, make_policy
from fleet_support import BREAKER, fleet_policy, make_store, namespace

BACKENDS = ["memory", "sqlite", "redis", "postgres"]

T0 = 1_780_000_000_000
PRIMARY = "private-primary"
BUDGET: Dict[str, Any] = {"scope": "tenant-7/summaries", "ratio_permille": 500, "floor_per_second": 100, "max_tokens": 100}


class Crash(BaseException):
    """The owner's process dies here (nothing after it runs)."""


def primary_down(clock: FakeClock, routes: List[str], crash_at: int = 0) -> Any:
    def dispatch(step: JournalStep) -> str:
        if step.ordinal == crash_at:
            raise Crash()
        routes.append(step.route_id)
        clock.advance(50)
        if step.route_id == PRIMARY:
            raise retryledger.AttemptError.retryable("unavailable")
        return "done"

    return dispatch


def primary_breaker(store: Any, ns: str, bundle: Dict[str, Any]) -> Dict[str, Any]:
    """The primary route's breaker as the fleet store holds it."""
    release = bundle["attempts"]["attempts"][0]["route_release_sha256"]
    document, generation = store.get(f"{ns}/breaker/{release}")
    assert document is not None and generation >= 1
    return dict(document)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_journaled_run_admits_every_attempt_through_its_fleet_and_records_each_outcome(backend: str, tmp_path: Path) -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    clock = FakeClock()
    clock.now = T0
    store = make_store(backend, tmp_path)
    ns = namespace()
    routes: List[str] = []
    decisions: List[Dict[str, Any]] = []
    attempts: List[Any] = []
    terminals: List[str] = []
    result = run_journaled(
        policy,
        primary_down(clock, routes),
        KEY,
        store=store,
        run_id=f"f-1-{ns}",
        log=f"{ns}/journal",
        lease=f"{ns}/lease",
        clock=clock,
        sleep=clock.sleep,
        fleet=Fleet(store, namespace=ns),
        on_decision=decisions.append,
        on_attempt=lambda attempt, judgement: attempts.append((attempt["ordinal"], judgement.to_dict()["outcome"])),
        on_terminal=lambda receipt: terminals.append(receipt["terminal"]),
    )
    assert result.terminal == "completed" and result.value == "done"
    assert routes[0] == PRIMARY and routes[-1] != PRIMARY
    # The receipt says what the fleet did; the journal verifies against the policy.
    # every retry withdrew from the retry budget; the bundle holds the snapshots each admission read.
    assert result.receipt["fleet"]["withdrawals"] == len(routes) - 1
    assert len(result.bundle["fleet_snapshots"]["breakers"]) >= len(routes)
    assert journal_verify(policy, result.events)["terminal"] == "completed"
    retryledger.verify_bundle(result.bundle_json)
    # The breaker of the primary holds its failures (written back after each attempt).
    assert primary_breaker(store, ns, result.bundle)["schema"] == "retryledger.breaker.v1"
    # The hooks of every driver: one decision per attempt and the terminal, each attempt, the end.
    assert [d["kind"] for d in decisions] == ["dispatch"] * len(routes) + ["terminal"]
    assert [a[0] for a in attempts] == list(range(1, len(routes) + 1))
    assert [a[1] for a in attempts] == [a["outcome"] for a in result.bundle["attempts"]["attempts"]]
    assert terminals == ["completed"]


def test_a_fleet_section_without_a_fleet_is_refused_before_anything_is_claimed() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    store = MemoryStore()
    with pytest.raises(retryledger.RetryledgerError) as info:
        run_journaled(policy, lambda s: "ok", KEY, store=store, run_id="f-2")
    assert info.value.code == "admission_missing"
    assert store.read(journal_log("f-2")) == [] and store.get(lease_key("f-2"))[1] == 0


def test_a_run_crashed_mid_way_resumes_and_admits_again_under_its_fleet(tmp_path: Path) -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))
    store = SQLiteStore(str(tmp_path / "run.db"))
    clock = FakeClock()
    clock.now = T0
    routes: List[str] = []
    with pytest.raises(Crash):
        run_journaled(
            policy, primary_down(clock, routes, crash_at=2), KEY, store=store, run_id="f-3", clock=clock, sleep=clock.sleep, fleet=Fleet(store)
        )
    held = [e.text for e in store.read(journal_log("f-3"))]
    assert held, "the first attempt is journaled"
    admissions_before = store.get("retryledger/budget/tenant-7/summaries")[1]
    # A new owner (another store handle on the same database) takes it over;
    # attempt 2 was dispatched without an observation: the receiver says it had no effect.
    again = SQLiteStore(str(tmp_path / "run.db"))
    result = resume(
        policy,
        primary_down(clock, routes),
        KEY,
        store=again,
        run_id="f-3",
        clock=clock,
        sleep=clock.sleep,
        fleet=Fleet(again),
        reconcile=lambda attempt: "failed_no_effect",
    )
    assert result.terminal == "completed" and result.lease_generation == 2
    assert journal_verify(policy, result.events)["terminal"] == "completed"
    # The resumed run admitted again: the retry budget's register moved on.
    assert again.get("retryledger/budget/tenant-7/summaries")[1] > admissions_before
    retryledger.verify_bundle(result.bundle_json)


def test_tenant_shares_name_the_fleets_tenant_in_a_journaled_run() -> None:
    admission = {
        "max_queue_ms": 1000,
        "request_burst": 1,
        "requests_per_second": 10,
        "tenant_weights": [{"tenant": "a", "weight": 1}, {"tenant": "b", "weight": 1}],
    }
    policy = retryledger.Policy(make_policy(fleet={"admission": admission, "on_store_unavailable": "fail_closed"}))
    clock = FakeClock()
    clock.now = T0
    store = MemoryStore()
    result = run_journaled(
        policy, lambda s: "ok", KEY, store=store, run_id="t-1", clock=clock, sleep=clock.sleep, fleet=Fleet(store, tenant="b")
    )
    assert result.terminal == "completed"
    release = result.bundle["attempts"]["attempts"][0]["route_release_sha256"]
    held: Any = store.get(f"retryledger/admission/{release}")[0]
    assert held is not None and [t["tenant"] for t in held["tenants"]] == ["b"]
    # Without the call's tenant the core refuses the first admission, coded.
    with pytest.raises(retryledger.RetryledgerError) as info:
        run_journaled(policy, lambda s: "ok", KEY, store=MemoryStore(), run_id="t-2", clock=clock, sleep=clock.sleep, fleet=Fleet(MemoryStore()))
    assert info.value.code == "invalid_value" and info.value.path == "/tenant"


def test_the_async_entry_point_takes_the_fleet_and_the_hooks() -> None:
    import asyncio

    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET))

    async def main() -> None:
        clock = FakeClock()
        clock.now = T0
        store = MemoryStore()
        routes: List[str] = []
        plain = primary_down(clock, routes)
        seen: List[int] = []

        async def dispatch(step: JournalStep) -> str:
            await asyncio.sleep(0)
            return str(plain(step))

        async def sleep(ms: float) -> None:
            clock.sleep(ms)

        result = await run_journaled_async(
            policy,
            dispatch,
            KEY,
            store=store,
            run_id="a-1",
            clock=clock,
            sleep=sleep,
            fleet=Fleet(store),
            on_attempt=lambda attempt, judgement: seen.append(attempt["ordinal"]),
        )
        assert result.terminal == "completed" and result.receipt["fleet"]["withdrawals"] == len(routes) - 1
        assert seen == list(range(1, len(routes) + 1))

    asyncio.run(main())
