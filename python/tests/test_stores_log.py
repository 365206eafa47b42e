"""Every store backend (memory, SQLite, Redis, PostgreSQL) is an append log:
the scenarios of tests/stores/log.json in order, each on a fresh namespace,
its refused inputs, and its race (8 clients appending to one seq at once:
exactly one wins, every other answer is the winner's event). Then what is
PostgreSQL's own: an unreachable server is StoreUnavailableError for every
call (a taken seq never is), several keys in one read."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any, Callable, List

import pytest

from retryledger.stores import Appended, LogEntry, PostgresStore, StoreUnavailableError

from conftest import ROOT
from fleet_support import database_url, make_store, namespace

CONFORMANCE = json.loads((ROOT / "tests" / "stores" / "log.json").read_text(encoding="utf-8"))
BACKENDS = ["memory", "sqlite", "redis", "postgres"]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_conformance_file_has_scenarios() -> None:
    assert CONFORMANCE["schema"] == "retryledger.log_conformance.v1"
    assert len(CONFORMANCE["scenarios"]) >= 9
    assert len(CONFORMANCE["refused"]["appends"]) >= 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_scenarios(backend: str, tmp_path: Path) -> None:
    store = make_store(backend, tmp_path)
    steps = 0
    for scenario in CONFORMANCE["scenarios"]:
        ns = namespace()
        for i, step in enumerate(scenario["steps"]):
            where = f"{scenario['name']} step {i}"
            expect = step["expect"]
            if "append" in step:
                got = store.append(f"{ns}/{step['append']}", step["seq"], step["event"])
                assert isinstance(got, Appended), where
                want = Appended(expect["ok"], expect["code"], expect.get("existing"))
                assert got == want, where
            elif "read" in step:
                entries = store.read(f"{ns}/{step['read']}", step.get("from", 0))
                assert all(isinstance(e, LogEntry) for e in entries), where
                assert [[e.seq, e.text] for e in entries] == expect, where
            elif "last_seq" in step:
                assert store.last_seq(f"{ns}/{step['last_seq']}") == expect, where
            elif "cas" in step:
                got_cas = store.compare_and_set(f"{ns}/{step['cas']}", step["expected"], step["document"])
                assert got_cas == (expect["ok"], expect["generation"]), where
            elif "get" in step:
                document, generation = store.get(f"{ns}/{step['get']}")
                assert (canonical(document), generation) == (canonical(expect["document"]), expect["generation"]), where
            else:
                raise AssertionError(f"unknown step {step}")
            steps += 1
    assert steps >= 39


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_refuses_what_no_store_takes(backend: str, tmp_path: Path) -> None:
    store = make_store(backend, tmp_path)
    refused = CONFORMANCE["refused"]
    log = f"{namespace()}/{refused['log']}"
    for bad in refused["appends"]:
        with pytest.raises((TypeError, ValueError)):
            store.append(log, bad["seq"], bad["event"])
    assert store.read(log) == []
    assert store.last_seq(log) is None
    with pytest.raises((TypeError, ValueError)):
        store.read(log, -1)
    with pytest.raises((TypeError, ValueError)):
        store.append("", 0, "{}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_race_one_winner_per_seq(backend: str, tmp_path: Path) -> None:
    race = CONFORMANCE["race"]
    workers, rounds = race["workers"], race["rounds"]
    shared = make_store(backend, tmp_path)
    log = f"{namespace()}/journal"
    answers: List[List[Appended]] = [[] for _ in range(rounds)]
    errors: List[BaseException] = []
    barrier = threading.Barrier(workers)
    lock = threading.Lock()

    def work(worker: int) -> None:
        try:
            store = shared if backend == "memory" else make_store(backend, tmp_path)
            for seq in range(rounds):
                barrier.wait(timeout=30)
                got = store.append(log, seq, json.dumps({"seq": seq, "worker": worker}))
                with lock:
                    answers[seq].append(got)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    entries = shared.read(log)
    assert [e.seq for e in entries] == list(range(rounds))
    for seq, got in enumerate(answers):
        assert len(got) == workers
        winners = [a for a in got if a.ok]
        assert len(winners) == 1, f"seq {seq}: {got}"
        held = entries[seq].text
        assert all(a == Appended(False, "seq_taken", held) for a in got if not a.ok), f"seq {seq}: {got}"


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_postgres_unreachable_is_unavailable() -> None:
    store = PostgresStore(f"postgresql://retryledger@127.0.0.1:{_closed_port()}/retryledger", connect_timeout=0.5)
    calls: List[Callable[[], object]] = [
        lambda: store.get("k"),
        lambda: store.get_many(["k", "l"]),
        lambda: store.compare_and_set("k", 0, {"a": 1}),
        lambda: store.check_and_set_raw([("k", 0, '{"a":1}')]),
        lambda: store.append("log", 0, "{}"),
        lambda: store.read("log"),
        lambda: store.last_seq("log"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailableError) as info:
            call()
        assert info.value.code == "store_unavailable"


def test_postgres_connection_lost_then_back(tmp_path: Path) -> None:
    """A connection the server ended is StoreUnavailableError once, and the
    next call opens another; nothing is retried behind the caller's back."""
    url = database_url()
    store = PostgresStore(url)
    ns = namespace()
    assert store.compare_and_set(f"{ns}/k", 0, {"v": 1}) == (True, 1)
    admin = PostgresStore(url)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        pids = [row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()]
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(StoreUnavailableError):
        store.compare_and_set(f"{ns}/k", 1, {"v": 2})
    assert store.get(f"{ns}/k") == ({"v": 1}, 1)
    assert store.compare_and_set(f"{ns}/k", 1, {"v": 2}) == (True, 2)
    assert admin.get(f"{ns}/k") == ({"v": 2}, 2)


def test_postgres_get_many_reads_what_get_reads(tmp_path: Path) -> None:
    store = make_store("postgres", tmp_path)
    assert isinstance(store, PostgresStore)
    ns = namespace()
    keys = [f"{ns}/breaker/a", f"{ns}/breaker/b", f"{ns}/budget/s"]
    assert store.compare_and_set(keys[0], 0, {"a": 1}) == (True, 1)
    assert store.compare_and_set(keys[2], 0, {"s": 1}) == (True, 1)
    assert store.compare_and_set(keys[2], 1, {"s": 2}) == (True, 2)
    assert store.get_many(keys) == [store.get(k) for k in keys] == [({"a": 1}, 1), (None, 0), ({"s": 2}, 2)]


def test_postgres_stores_text_not_jsonb(tmp_path: Path) -> None:
    """The columns are text: a document's and an event's bytes come back as written."""
    store = make_store("postgres", tmp_path)
    assert isinstance(store, PostgresStore)
    ns = namespace()
    assert store.compare_and_set_raw(f"{ns}/k", 0, '{"z":1, "a" :2}') == (True, 1)
    assert store.get_raw(f"{ns}/k") == ('{"z":1, "a" :2}', 1)


def test_sqlite_synchronous_setting(tmp_path: Path) -> None:
    from retryledger.stores import SQLiteStore

    for setting, value in (("NORMAL", 1), ("FULL", 2)):
        store = SQLiteStore(tmp_path / f"{setting}.sqlite3", synchronous=setting)
        assert store._conn.execute("PRAGMA synchronous").fetchone() == (value,)
        assert store._conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        store.close()
    with pytest.raises(ValueError):
        SQLiteStore(tmp_path / "x.sqlite3", synchronous="OFF")


def _ts_template(path: Path, name: str) -> str:
    import re

    found = re.search(r"export const " + name + r" = `(.*?)`;", path.read_text(encoding="utf-8"), re.S)
    assert found is not None, f"{name} in {path}"
    return found.group(1)


def test_both_packages_send_the_same_sql_and_scripts() -> None:
    """The PostgreSQL function and tables and the Redis append script are
    written once per package: they must be the same text in both."""
    from retryledger.stores import postgres, redis

    ts = ROOT / "wasm" / "ts" / "stores"
    assert _ts_template(ts / "postgres.ts", "CHECK_AND_SET_FUNCTION") == postgres.CHECK_AND_SET_FUNCTION
    assert _ts_template(ts / "redis.ts", "APPEND_SCRIPT") == redis.APPEND_SCRIPT
    text = (ts / "postgres.ts").read_text(encoding="utf-8")
    for statement in postgres.SCHEMA:
        assert f'"{statement}"' in text
