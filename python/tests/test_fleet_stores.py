"""Every store backend (memory, SQLite, Redis, PostgreSQL) passes the register conformance
scenarios of tests/stores/register.json, in order, each on a fresh namespace,
and its concurrency section: 8 workers (threads, and for the shared backends
processes) adding 1 to a counter 50 times each through get and
compare_and_set lose no increment."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest

from retryledger.stores import SQLiteStore, Store, StoreUnavailableError

from conftest import ROOT
from fleet_support import CHILD, make_store, namespace, store_target

CONFORMANCE = json.loads((ROOT / "tests" / "stores" / "register.json").read_text(encoding="utf-8"))
BACKENDS = ["memory", "sqlite", "redis", "postgres"]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_conformance_file_has_scenarios() -> None:
    assert CONFORMANCE["schema"] == "retryledger.store_conformance.v1"
    assert len(CONFORMANCE["scenarios"]) >= 7


@pytest.mark.parametrize("backend", BACKENDS)
def test_register_scenarios(backend: str, tmp_path: Path) -> None:
    store = make_store(backend, tmp_path)
    for scenario in CONFORMANCE["scenarios"]:
        ns = namespace()
        for i, step in enumerate(scenario["steps"]):
            where = f"{scenario['name']} step {i}"
            expect = step["expect"]
            if "get" in step:
                document, generation = store.get(f"{ns}/{step['get']}")
                assert generation == expect["generation"], where
                assert canonical(document) == canonical(expect["document"]), where
            else:
                ok, generation = store.compare_and_set(f"{ns}/{step['cas']}", step["expected"], step["document"])
                assert (ok, generation) == (expect["ok"], expect["generation"]), where


def _increment(store: Store, key: str, times: int) -> int:
    conflicts = 0
    for _ in range(times):
        while True:
            document, generation = store.get(key)
            count = 0 if document is None else int(document["count"])
            ok, _ = store.compare_and_set(key, generation, {"count": count + 1})
            if ok:
                break
            conflicts += 1
    return conflicts


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_threads_lose_no_increment(backend: str, tmp_path: Path) -> None:
    spec = CONFORMANCE["concurrency"]
    workers, increments = spec["workers"], spec["increments"]
    key = f"{namespace()}/counter"
    errors: List[BaseException] = []

    def work() -> None:
        # One store object per worker, as separate clients would have.
        try:
            _increment(make_store(backend, tmp_path) if backend != "memory" else shared, key, increments)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    shared = make_store(backend, tmp_path)
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    document, generation = shared.get(key)
    assert document == {"count": workers * increments}
    assert generation == workers * increments


@pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"])
def test_concurrent_processes_lose_no_increment(backend: str, tmp_path: Path) -> None:
    spec = CONFORMANCE["concurrency"]
    workers, increments = spec["workers"], spec["increments"]
    target = store_target(backend, tmp_path)
    key = f"{namespace()}/counter"
    make_store(backend, tmp_path)  # the SQLite file and table exist before the children start
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), "increment", backend, target, key, str(increments)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    outputs = [c.communicate(timeout=120) for c in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err
    document, generation = make_store(backend, tmp_path).get(key)
    assert document == {"count": workers * increments}
    assert generation == workers * increments


def test_sqlite_reports_a_locked_database_as_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "locked.sqlite3"
    store = SQLiteStore(path, busy_timeout_ms=50)
    holder = SQLiteStore(path)
    conn = holder._conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailableError):
            store.compare_and_set("k", 0, {"a": 1})
    finally:
        conn.execute("ROLLBACK")
    assert store.compare_and_set("k", 0, {"a": 1}) == (True, 1)


def test_redis_unreachable_is_unavailable() -> None:
    import socket

    from retryledger.stores import RedisStore

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    store = RedisStore(url=f"redis://127.0.0.1:{port}/0", socket_timeout=0.2, socket_connect_timeout=0.2)
    with pytest.raises(StoreUnavailableError):
        store.get("k")
    with pytest.raises(StoreUnavailableError):
        store.compare_and_set("k", 0, {"a": 1})


def test_redis_get_many_reads_what_get_reads(tmp_path: Path) -> None:
    from retryledger.stores import RedisStore

    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    ns = namespace()
    keys = [f"{ns}/breaker/a", f"{ns}/breaker/b", f"{ns}/budget/s"]
    assert store.compare_and_set(keys[0], 0, {"a": 1}) == (True, 1)
    assert store.compare_and_set(keys[2], 0, {"s": 1}) == (True, 1)
    assert store.compare_and_set(keys[2], 1, {"s": 2}) == (True, 2)
    assert store.get_many(keys) == [store.get(k) for k in keys] == [({"a": 1}, 1), (None, 0), ({"s": 2}, 2)]
