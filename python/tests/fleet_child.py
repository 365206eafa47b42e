"""A child process for the fleet tests (several processes sharing one store).

    fleet_child.py increment <sqlite|redis|postgres> <target> <key> <times>
        add 1 to the counter document at <key> <times> times (get, compare_and_set, retry)
    fleet_child.py outage <sqlite|redis> <target> <namespace> <policy.json> <runs> <go-file> <out.json>
        wait for <go-file> to exist, then <runs> runs whose primary route is down
        (every attempt on it fails unavailable) and whose fallback serves; write
        {primary, fallback, terminals} to <out.json>
    fleet_child.py run <sqlite|redis> <target> <namespace> <policy.json> <script> <out.json>
        drive retryledger.run with fleet= against the store; <script> is a
        comma-separated list of what each dispatch does (ok, unavailable,
        ok@<route_id>...); write {terminal, attempts, routes, bundle} to <out.json>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import retryledger  # noqa: E402
from retryledger.fleet import Fleet  # noqa: E402
from retryledger.stores import PostgresStore, RedisStore, SQLiteStore, Store  # noqa: E402


def open_store(backend: str, target: str) -> Store:
    if backend == "sqlite":
        return SQLiteStore(target)
    if backend == "redis":
        return RedisStore(url=target)
    if backend == "postgres":
        return PostgresStore(target)
    raise SystemExit(f"unknown backend {backend}")


def increment(store: Store, key: str, times: int) -> None:
    for _ in range(times):
        while True:
            document, generation = store.get(key)
            count = 0 if document is None else int(document["count"])
            if store.compare_and_set(key, generation, {"count": count + 1})[0]:
                break


def run(store: Store, ns: str, policy_path: str, script: str, out: str) -> None:
    from conftest import KEY

    policy = retryledger.Policy(Path(policy_path).read_text(encoding="utf-8"))
    fleet = Fleet(store, namespace=ns)
    actions = script.split(",") if script else []
    routes: List[str] = []

    def dispatch(step: retryledger.Step) -> str:
        routes.append(step.route_id)
        action = actions[len(routes) - 1] if len(routes) <= len(actions) else "ok"
        if action == "ok":
            return "done"
        raise retryledger.AttemptError.retryable("unavailable")

    result: Dict[str, Any]
    try:
        r = retryledger.run(policy, dispatch, KEY, fleet=fleet)
        result = {"terminal": r.terminal, "bundle": r.bundle_json}
    except retryledger.RunStoppedError as e:
        result = {"terminal": e.terminal, "bundle": e.bundle_json}
    result["routes"] = routes
    Path(out).write_text(json.dumps(result), encoding="utf-8")


def outage(store: Store, ns: str, policy_path: str, runs: int, go: str, out: str) -> None:
    import time

    from conftest import KEY

    policy = retryledger.Policy(Path(policy_path).read_text(encoding="utf-8"))
    fleet = Fleet(store, namespace=ns, max_conflicts=200)
    counts = {"primary": 0, "fallback": 0}

    def dispatch(step: retryledger.Step) -> str:
        if step.route_id == "private-primary":
            counts["primary"] += 1
            time.sleep(0.002)  # a failing call takes a little time
            raise retryledger.AttemptError.retryable("unavailable")
        counts["fallback"] += 1
        return "done"

    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.001)
    terminals: List[str] = []
    for _ in range(runs):
        try:
            terminals.append(retryledger.run(policy, dispatch, KEY, fleet=fleet).terminal)
        except retryledger.RunStoppedError as e:
            terminals.append(e.terminal)
    Path(out).write_text(json.dumps(dict(counts, terminals=terminals)), encoding="utf-8")


def main(argv: List[str]) -> None:
    command, backend, target = argv[1], argv[2], argv[3]
    store = open_store(backend, target)
    if command == "increment":
        increment(store, argv[4], int(argv[5]))
    elif command == "outage":
        outage(store, argv[4], argv[5], int(argv[6]), argv[7], argv[8])
    elif command == "run":
        run(store, argv[4], argv[5], argv[6], argv[7])
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv)
