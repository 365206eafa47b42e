"""An outage seen by a fleet of 8 processes: the primary route is down, each
process makes 10 runs concurrently through one shared store (SQLite, Redis).
Without a fleet each run would send 2 attempts to the primary (160 in all);
with the shared breaker (open after 2 consecutive failures, 60 s) the
primary receives at most the 2 failures that open it plus one in-flight
attempt per other process, and every run completes on the fallback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from retryledger.fleet import Fleet

from fleet_support import CHILD, fleet_policy, make_store, namespace, store_target

WORKERS = 8
RUNS = 10
OPEN_BREAKER = {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 60_000}


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_eight_processes_stop_sending_to_a_down_route(backend: str, tmp_path: Path) -> None:
    make_store(backend, tmp_path)
    target = store_target(backend, tmp_path)
    ns = namespace()
    policy_path = tmp_path / "policy.json"
    policy_path.write_text(json.dumps(fleet_policy(breaker=OPEN_BREAKER)), encoding="utf-8")
    go = tmp_path / "go"
    outs = [tmp_path / f"out-{i}.json" for i in range(WORKERS)]
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), "outage", backend, target, ns, str(policy_path), str(RUNS), str(go), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in outs
    ]
    go.write_text("go")  # every child imports, opens the store, then starts at once
    for child in children:
        _, err = child.communicate(timeout=180)
        assert child.returncode == 0, err
    results: List[Dict[str, Any]] = [json.loads(o.read_text(encoding="utf-8")) for o in outs]
    primary = sum(r["primary"] for r in results)
    fallback = sum(r["fallback"] for r in results)
    terminals = [t for r in results for t in r["terminals"]]
    assert terminals == ["completed"] * (WORKERS * RUNS)
    assert fallback == WORKERS * RUNS
    assert 2 <= primary <= OPEN_BREAKER["consecutive_failures"] + WORKERS - 1, primary
    print(f"{backend}: {primary} attempts reached the down primary (160 without the fleet)")
    # The breaker is open in the store for everyone.
    policy = json.loads(policy_path.read_text(encoding="utf-8"))
    release = policy["routes"][0]["route_release_sha256"]
    snapshot = Fleet(make_store(backend, tmp_path), namespace=ns).breaker(release)
    assert snapshot is not None and snapshot["state"] == "open"
