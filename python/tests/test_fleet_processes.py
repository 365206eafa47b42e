"""Fleet protection across processes and across a store outage: two processes
share a breaker through SQLite and through Redis; a Redis server killed and
restarted mid-run (fail_closed and fail_open); 8 concurrent workers sharing
one breaker and one retry budget lose no deposit or withdrawal."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import retryledger
from retryledger import AttemptError, RunStoppedError, Step
from retryledger.fleet import Fleet
from retryledger.stores import RedisStore

from conftest import KEY
from fleet_support import BREAKER, CHILD, RedisServer, fleet_policy, make_store, namespace, store_target

PRIMARY = "private-primary"
FALLBACK = "external-fallback"
SCOPE = "tenant-7/summaries"
BUDGET: Dict[str, Any] = {"scope": SCOPE, "ratio_permille": 500, "floor_per_second": 1, "max_tokens": 3}


def child_run(backend: str, target: str, ns: str, policy_path: Path, script: str, out: Path) -> Dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CHILD), "run", backend, target, ns, str(policy_path), script, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: Dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


@pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"])
def test_two_processes_share_a_breaker(backend: str, tmp_path: Path) -> None:
    make_store(backend, tmp_path)  # creates the SQLite file, or checks REDIS_URL
    target = store_target(backend, tmp_path)
    ns = namespace()
    policy_path = tmp_path / "policy.json"
    policy_path.write_text(json.dumps(fleet_policy(breaker=BREAKER)), encoding="utf-8")
    # Process A: the primary fails twice (the breaker opens), the fallback serves.
    a = child_run(backend, target, ns, policy_path, "unavailable,unavailable,ok", tmp_path / "a.json")
    assert a["terminal"] == "completed"
    assert a["routes"] == [PRIMARY, PRIMARY, FALLBACK]
    # Process B, started after: the open primary is skipped, nothing sent to it.
    b = child_run(backend, target, ns, policy_path, "ok", tmp_path / "b.json")
    assert b["terminal"] == "completed"
    assert b["routes"] == [FALLBACK]
    bundle = json.loads(b["bundle"])
    assert bundle["attempts"]["attempts"][0]["admission"]["skipped"][0]["route_id"] == PRIMARY
    assert retryledger.verify_bundle(b["bundle"])["kind"] == "verified"
    # Both processes' outcomes are in the one fallback breaker.
    fleet = Fleet(make_store(backend, tmp_path), namespace=ns)
    fallback = bundle["attempts"]["attempts"][0]["route_release_sha256"]
    snapshot = fleet.breaker(fallback)
    assert snapshot is not None and snapshot["window_total"] == 2


def _killing(server: RedisServer, routes: List[str], then: Any = None) -> Any:
    """Attempt 1 kills the server and fails; later attempts run ``then``."""

    def dispatch(step: Step) -> str:
        routes.append(step.route_id)
        if len(routes) == 1:
            server.kill()
            raise AttemptError.retryable("unavailable")
        if then is not None:
            return str(then(step))
        raise AttemptError.retryable("unavailable")

    return dispatch


def recording(routes: List[str]) -> Any:
    def dispatch(step: Step) -> str:
        routes.append(step.route_id)
        return "ok"

    return dispatch


def _run(policy: retryledger.Policy, fleet: Fleet, dispatch: Any) -> Tuple[str, Dict[str, Any]]:
    try:
        r = retryledger.run(policy, dispatch, KEY, fleet=fleet)
        return r.terminal, r.bundle
    except RunStoppedError as e:
        return e.terminal, e.bundle


def test_redis_killed_mid_run_fails_closed_then_serves_again(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        store = RedisStore(url=server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        fleet = Fleet(store, namespace=namespace())
        policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET, on_store_unavailable="fail_closed"))
        routes: List[str] = []
        terminal, bundle = _run(policy, fleet, _killing(server, routes))
        assert terminal == "stop_store_unavailable"
        assert routes == [PRIMARY]  # nothing dispatched once the store was gone
        assert bundle["attempts"]["fleet_stop"]["reason"] == "store_unavailable"
        assert retryledger.verify_bundle(json.dumps(bundle))["kind"] == "verified"

        server.start()  # restarted empty (no persistence)
        routes.clear()
        terminal, bundle = _run(policy, fleet, recording(routes))
        assert terminal == "completed"
        admission = bundle["attempts"]["attempts"][0]["admission"]
        assert "store" not in admission and admission["budget"]["kind"] == "deposit"
        assert fleet.budget(SCOPE) is not None


def test_redis_killed_and_restarted_mid_run_fails_open(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        store = RedisStore(url=server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        fleet = Fleet(store, namespace=namespace())
        policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=BUDGET, on_store_unavailable="fail_open"))
        routes: List[str] = []

        def restart_then_fail(step: Step) -> str:
            if len(routes) == 2:
                server.start()
            if step.route_id == PRIMARY:
                raise AttemptError.retryable("unavailable")
            return "ok"

        terminal, bundle = _run(policy, fleet, _killing(server, routes, restart_then_fail))
        # 1: through the store; 2: Redis down, admitted without it (fail
        # open); 3: Redis back but empty: its budget holds no token (the
        # deposit was lost with the old server), so the fallback is refused.
        assert terminal == "stop_retry_budget"
        assert routes == [PRIMARY, PRIMARY]
        stores = [a["admission"].get("store") for a in bundle["attempts"]["attempts"]]
        assert stores == [None, "unavailable"]
        assert bundle["attempts"]["fleet_stop"]["reason"] == "retry_budget"
        assert bundle["receipt"]["fleet"]["admitted_without_store"] == 1
        assert retryledger.verify_bundle(json.dumps(bundle))["kind"] == "verified"
        # The next run goes through the restarted store again.
        routes.clear()
        terminal, bundle = _run(policy, fleet, recording(routes))
        assert terminal == "completed"
        assert "store" not in bundle["attempts"]["attempts"][0]["admission"]
        budget = fleet.budget(SCOPE)
        assert budget is not None and budget["deposits"] >= 1


@pytest.mark.parametrize("backend", ["memory", "sqlite", "redis", "postgres"])
def test_eight_concurrent_workers_lose_no_deposit_or_withdrawal(backend: str, tmp_path: Path) -> None:
    """8 threads, each with its own store client, 10 runs each; the primary
    fails every attempt, the fallback serves. The budget's counters are exactly
    the first attempts and retries the runs recorded, and every bundle verifies."""
    workers, runs = 8, 10
    ns = namespace()
    budget = {"scope": SCOPE, "ratio_permille": 1000, "floor_per_second": 1, "max_tokens": 1000}
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=budget))
    shared = make_store(backend, tmp_path)
    results: List[Tuple[str, Dict[str, Any]]] = []
    errors: List[BaseException] = []
    lock = threading.Lock()

    def dispatch(step: Step) -> str:
        if step.route_id == PRIMARY:
            raise AttemptError.retryable("unavailable")
        return "ok"

    def work() -> None:
        try:
            store = shared if backend == "memory" else make_store(backend, tmp_path)
            fleet = Fleet(store, namespace=ns, max_conflicts=200)
            for _ in range(runs):
                out = _run(policy, fleet, dispatch)
                with lock:
                    results.append(out)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == workers * runs
    first_attempts = retries = 0
    for terminal, bundle in results:
        attempts = bundle["attempts"]["attempts"]
        first_attempts += sum(1 for a in attempts if a["admission"]["budget"]["kind"] == "deposit")
        retries += sum(1 for a in attempts if a["admission"]["budget"]["kind"] == "withdraw")
        assert retryledger.verify_bundle(json.dumps(bundle))["kind"] == "verified"
    document = Fleet(shared, namespace=ns).budget(SCOPE)
    assert document is not None
    assert first_attempts == workers * runs
    assert (document["deposits"], document["withdrawals"]) == (first_attempts, retries)
