"""Fair tenant shares measured with 8 separate processes sharing one Redis
store (``REDIS_URL``) and one loopback server that counts each tenant's
requests: a route of 20 requests per second (burst 1) shared by four
tenants of weight 1, so each is owed 5 per second. One tenant ("noisy", 5
processes of 10 threads) offers 50 per second, 10 times its share; three
others (one process of 2 threads each) offer 6 per second. Every other tenant gets at least 95 % of
its share, and each of the noisy tenant's runs either completes or stops
``stop_admission`` with the refusal ``tenant_over_share``. ``pytest -s``
prints the figures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

import retryledger
from retryledger import RetryledgerError, RunStoppedError, Step
from retryledger.fleet import Fleet
from retryledger.stores import MemoryStore

from fleet_support import HERE, Server, make_store, namespace, redis_url

from conftest import KEY, FakeClock, make_policy

CHILD = HERE / "fleet_tenant_child.py"
PER_SECOND = 20
BURST = 1
SECONDS = 6.0
WAIT_S = 120
#: (tenant, processes, threads per process, calls per second of each thread)
TENANTS: List[Tuple[str, int, int, float]] = [
    ("noisy", 5, 10, 1.0),
    ("quiet-a", 1, 2, 3.0),
    ("quiet-b", 1, 2, 3.0),
    ("quiet-c", 1, 2, 3.0),
]
SHARE_PER_SECOND = PER_SECOND / len(TENANTS)


EPOCH = 1_780_000_000_000


def shares_policy(max_queue_ms: int = 1000) -> retryledger.Policy:
    """10 requests per second, burst 1, shared by tenants a and b (weight 1 each)."""
    admission = {
        "max_queue_ms": max_queue_ms,
        "request_burst": 1,
        "requests_per_second": 10,
        "tenant_weights": [{"tenant": "a", "weight": 1}, {"tenant": "b", "weight": 1}],
    }
    return retryledger.Policy(make_policy(fleet={"admission": admission, "on_store_unavailable": "fail_closed"}))


def drive(policy: retryledger.Policy, fleet: Fleet) -> Tuple[str, Dict[str, Any], FakeClock]:
    """One run on a fake clock whose wall clock starts at EPOCH."""
    clock = FakeClock()

    def dispatch(step: Step) -> str:
        return "done"

    try:
        r = retryledger.run(
            policy, dispatch, KEY, fleet=fleet, clock=clock, sleep=clock.sleep, wall_clock=lambda: EPOCH + clock.now
        )
        return r.terminal, r.bundle, clock
    except RunStoppedError as e:
        return e.terminal, e.bundle, clock


def test_a_tenant_over_its_share_waits_behind_one_under_it() -> None:
    """a is admitted at once; b (under its share) queues in the spent
    bucket for 100 ms; a again, now over its share of two tenants, reserves
    nothing, waits for its share (100 ms) and then queues behind b."""
    policy = shares_policy()
    store = MemoryStore()
    ns = namespace()
    a, b = Fleet(store, namespace=ns, tenant="a"), Fleet(store, namespace=ns, tenant="b")
    _, first, _ = drive(policy, a)
    terminal, second, _ = drive(policy, b)
    assert terminal == "completed"
    limits = second["attempts"]["attempts"][0]["admission"]["limits"]
    assert (limits["tenant"], limits["queue_wait_ms"]) == ("b", 100)
    terminal, third, clock = drive(policy, a)
    assert terminal == "completed"
    limits = third["attempts"]["attempts"][0]["admission"]["limits"]
    assert (limits["tenant"], limits["queue_wait_ms"], limits["start_epoch_ms"]) == ("a", 200, EPOCH + 200)
    assert clock.now >= 200
    for bundle in (first, second, third):
        assert retryledger.verify_bundle(bundle)["kind"] == "verified"
    snapshot = a.admission(policy, str(policy.document["routes"][0]["route_release_sha256"]))
    assert snapshot is not None
    assert [t["tenant"] for t in snapshot["tenants"]] == ["a", "b"]


def test_over_its_share_past_the_queue_bound_stops_with_the_reason() -> None:
    policy = shares_policy(max_queue_ms=50)
    store = MemoryStore()
    ns = namespace()
    assert drive(policy, Fleet(store, namespace=ns, tenant="a"))[0] == "completed"
    # b, under its share, would queue 100 ms: past the 50 ms bound (no reason).
    terminal, bundle, _ = drive(policy, Fleet(store, namespace=ns, tenant="b"))
    assert terminal == "stop_admission" and "refusal" not in bundle["attempts"]["fleet_stop"]["limits"]
    # a, alone and faster than the rate, is over its share: its share covers
    # it 100 ms later, past the bound.
    terminal, bundle, _ = drive(policy, Fleet(store, namespace=ns, tenant="a"))
    assert terminal == "stop_admission"
    stop = bundle["attempts"]["fleet_stop"]
    assert (stop["limits"]["refusal"], stop["limits"]["tenant"]) == ("tenant_over_share", "a")
    assert bundle["attempts"]["attempts"] == []
    assert retryledger.verify_bundle(bundle)["kind"] == "verified"


@pytest.mark.parametrize("tenant", [None, "c"])
def test_a_call_without_a_listed_tenant_is_refused_before_dispatch(tenant: Optional[str]) -> None:
    with pytest.raises(RetryledgerError) as e:
        drive(shares_policy(), Fleet(MemoryStore(), namespace=namespace(), tenant=tenant))
    assert (e.value.code, e.value.path) == ("invalid_value", "/tenant")


def test_the_fleet_checks_its_tenant() -> None:
    with pytest.raises(ValueError):
        Fleet(MemoryStore(), tenant="")




def test_a_noisy_tenant_at_ten_times_its_share_starves_no_other(tmp_path: Path) -> None:
    make_store("redis", tmp_path)  # fails under make, skips by hand, without REDIS_URL
    ns = namespace()
    admission = {
        "max_queue_ms": 500,
        "request_burst": BURST,
        "requests_per_second": PER_SECOND,
        "tenant_weights": [{"tenant": name, "weight": 1} for name, _, _, _ in TENANTS],
    }
    policy = make_policy(fleet={"admission": admission, "on_store_unavailable": "fail_closed"}, deadline_ms=30_000)
    policy_path = tmp_path / "policy.json"
    policy_path.write_text(json.dumps(policy), encoding="utf-8")
    go = tmp_path / "go"
    plan = [(name, threads, rate) for name, processes, threads, rate in TENANTS for _ in range(processes)]
    assert len(plan) == 8
    readies = [tmp_path / f"ready-{i}" for i in range(len(plan))]
    outs = [tmp_path / f"out-{i}.json" for i in range(len(plan))]
    with Server(hold_s=0.01) as server:
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(CHILD),
                    redis_url(),
                    ns,
                    str(policy_path),
                    str(SECONDS),
                    str(r),
                    str(go),
                    str(o),
                    server.url,
                    name,
                    str(rate),
                    str(threads),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for (name, threads, rate), r, o in zip(plan, readies, outs)
        ]
        try:
            deadline = time.monotonic() + WAIT_S
            while not all(r.exists() for r in readies):
                failed = [c for c in children if c.poll() is not None]
                assert not failed, failed[0].communicate(timeout=WAIT_S)[1]
                assert time.monotonic() < deadline, "the children did not get ready in time"
                time.sleep(0.01)
            go.write_text("go", encoding="utf-8")
            for child in children:
                _, err = child.communicate(timeout=WAIT_S)
                assert child.returncode == 0, err
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait(timeout=WAIT_S)
        log = list(server.log)
    docs = [json.loads(o.read_text(encoding="utf-8")) for o in outs]
    rows: Dict[str, List[Dict[str, Any]]] = {}
    for d in docs:
        rows.setdefault(d["tenant"], []).extend(d["rows"])
    served: Dict[str, int] = {}
    for _, _, tenant in log:
        served[tenant] = served.get(tenant, 0) + 1
    offered = {name: len(rs) for name, rs in rows.items()}

    # The noisy tenant offered 10 times its share.
    assert offered["noisy"] >= 0.9 * 10 * SHARE_PER_SECOND * SECONDS, offered

    # Every other tenant got at least 95 % of its fair share, counted by the server.
    fair = SHARE_PER_SECOND * SECONDS
    for name, _, _, _ in TENANTS[1:]:
        assert served.get(name, 0) >= 0.95 * fair, (name, served, fair)
        # Asking 1.2 times its share, its own excess waits too and may stop
        # stop_admission before any dispatch (over its share, or for the
        # queue bound once its share came back): never a dispatched failure.
        held = [r for r in rows[name] if r["terminal"] != "completed"]
        assert all(r["terminal"] == "stop_admission" and r["attempts"] == 0 for r in held), held[:2]
        assert len(held) <= offered[name] - 0.95 * fair, (name, len(held), offered[name])

    # The noisy tenant's excess stopped with the coded reason (or waited and
    # completed): no other terminal, and some runs were stopped.
    noisy = rows["noisy"]
    stopped = [r for r in noisy if r["terminal"] != "completed"]
    assert stopped, "the noisy tenant was never held back"
    # Each stopped before any dispatch: over its share at its last ask
    # (refusal tenant_over_share), or, its share back by then, with the
    # bucket's queue ahead past the queue bound it spent waiting.
    assert all(r["terminal"] == "stop_admission" and r["attempts"] == 0 for r in stopped), stopped[:3]
    over_share = [r for r in stopped if r["refusal"] == "tenant_over_share"]
    assert all(r["refusal"] is None for r in stopped if r not in over_share)
    assert over_share
    assert served.get("noisy", 0) == len(noisy) - len(stopped)

    # The route's rate held: no more requests than the bucket allows over the span.
    times = sorted(at for at, _, _ in log)
    span_s = (times[-1] - times[0]) / 1000
    assert len(log) <= BURST + span_s * PER_SECOND + 1, (len(log), span_s)

    failures = [f for d in docs for f in d["failures"]]
    assert not failures, json.dumps(failures[0])[:3000]
    assert sum(d["verified"].get("stop_admission", 0) for d in docs) > 0

    conflicts = sum(d["conflicts"] for d in docs)
    admissions = sum(d["admissions"] for d in docs)
    print(
        f"\ntenant shares: 8 processes, {SECONDS:.0f} s, {PER_SECOND}/s burst {BURST} shared by {len(TENANTS)} tenants "
        f"(fair share {fair:.0f} requests each); offered {offered}; served {served}; "
        f"noisy stopped {len(stopped)} ({len(over_share)} tenant_over_share), "
        f"(others) {sum(1 for n, rs in rows.items() if n != 'noisy' for r in rs if r['terminal'] != 'completed')}; {len(log)} requests in {span_s:.2f} s; "
        f"{admissions} admission calls, {conflicts} conflicts"
    )
