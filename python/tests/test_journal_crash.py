"""Crash tests of journal-backed runs with real processes: a worker process
runs the reference run and a fallback run with a journal on SQLite and on
PostgreSQL, and is killed with SIGKILL after every journal prefix in turn (and
after each attempt's answer, before its observation); a new process then
resumes the run. The fake receiver (journal_receiver.py) records every
attempt by idempotency key and ordinal and answers reconciliation by what it
recorded. Counted over every crash: resubmissions of a dispatched attempt
(must be 0) and stale appends the store accepted from a fenced owner (must be
0); a run whose crash left nothing to reconcile ends with the receipt digest
of the uncrashed run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest

import retryledger
from retryledger.journal import journal_verify
from retryledger.journaled import journal_log
from retryledger.stores import PostgresStore, SQLiteStore

from conftest import make_policy
from fleet_support import database_url
from journal_receiver import Receiver

CHILD = Path(__file__).resolve().parent / "journal_child.py"


def target_of(backend: str, tmp: Path) -> str:
    if backend == "sqlite":
        return str(tmp / "journal.sqlite")
    return database_url()


def open_store(backend: str, target: str) -> Any:
    return SQLiteStore(target) if backend == "sqlite" else PostgresStore(target)


def child(
    mode: str, backend: str, target: str, run_id: str, url: str, out: Path, env: Optional[Dict[str, str]] = None
) -> Tuple[int, Optional[Dict[str, Any]]]:
    if out.exists():
        out.unlink()
    done = subprocess.run(
        [sys.executable, str(CHILD), mode, backend, target, run_id, url, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    if done.returncode == 0:
        return 0, json.loads(out.read_text(encoding="utf-8"))
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.returncode, None


class Tally:
    def __init__(self) -> None:
        self.crashes = 0
        self.resubmissions = 0
        self.reconciled = 0
        self.same_receipt = 0


def check_resumed(
    tally: Tally, receiver: Receiver, run_id: str, base: Dict[str, Any], resumed: Dict[str, Any], events: Any
) -> None:
    """What every resumed run must show."""
    served = receiver.received(run_id)
    tally.resubmissions += sum(len(s) - 1 for s in served.values())
    assert all(len(s) == 1 for s in served.values()), served
    assert retryledger.verify_bundle(resumed["bundle"])["kind"] == "verified"
    policy = make_policy()
    verified = journal_verify(policy, events)
    assert verified["terminal"] == resumed["terminal"]
    attempts = json.loads(resumed["bundle"])["attempts"]["attempts"]
    # The receiver saw only the journal's attempts, and every attempt observed
    # or reconciled as succeeded reached it.
    assert set(served) <= {a["ordinal"] for a in attempts}
    for a in attempts:
        if a.get("reconciled") != "failed_no_effect":
            assert a["ordinal"] in served, (a, served)
    for a in attempts:
        if "reconciled" in a:
            tally.reconciled += 1
            truth = "succeeded" if served.get(a["ordinal"]) == [200] else "failed_no_effect"
            assert a["reconciled"] == truth, (a, served)
            if truth == "succeeded":
                assert resumed["terminal"] == base["terminal"] == "completed"
    if not resumed["reconciled"]:
        assert resumed["receipt_sha256"] == base["receipt_sha256"]
        tally.same_receipt += 1


@pytest.mark.parametrize("script", ["reference", "fallback"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_every_prefix_is_recovered_without_resubmission(backend: str, script: str, tmp_path: Path) -> None:
    target = target_of(backend, tmp_path)
    store = open_store(backend, target)
    out = tmp_path / "out.json"
    tally = Tally()
    lock = threading.Lock()
    tag = uuid.uuid4().hex[:8]
    with Receiver() as receiver:
        base_id = f"crash-{script}-{tag}-base"
        receiver.scripts[base_id] = script
        code, base = child("run", backend, target, base_id, receiver.url, out)
        assert code == 0 and base is not None and base["terminal"] == "completed"
        total = len(store.read(journal_log(base_id), 0))
        attempts = len(json.loads(base["bundle"])["attempts"]["attempts"])
        assert total == 4 * attempts + 3
        crashes = [("JOURNAL_KILL_AFTER_SEQ", k) for k in range(total)]
        crashes += [("JOURNAL_KILL_AFTER_CALL", n) for n in range(1, attempts + 1)]

        def crash_and_resume(crash: Tuple[str, int]) -> None:
            name, at = crash
            run_id = f"crash-{script}-{tag}-{name[12:].lower()}-{at}"
            out = tmp_path / f"{run_id}.json"
            receiver.scripts[run_id] = script
            code, _ = child("run", backend, target, run_id, receiver.url, out, {name: str(at)})
            assert code == -signal.SIGKILL
            mine = open_store(backend, target)
            held = len(mine.read(journal_log(run_id), 0))
            if name == "JOURNAL_KILL_AFTER_SEQ":
                assert held == at + 1  # every event up to the kill is durable, none after it
            code, resumed = child("resume", backend, target, run_id, receiver.url, out)
            assert code == 0 and resumed is not None, run_id
            assert resumed["lease_generation"] == 2
            events = [json.loads(e.text) for e in mine.read(journal_log(run_id), 0)]
            with lock:
                tally.crashes += 1
                check_resumed(tally, receiver, run_id, base, resumed, events)

        # Independent runs: a few at a time.
        with ThreadPoolExecutor(max_workers=4) as pool:
            for done in pool.map(crash_and_resume, crashes):
                assert done is None
    print(
        f"journal crash test (python, {backend}, {script} run): {tally.crashes} crashes "
        f"({total} prefixes + {attempts} lost answers), {tally.resubmissions} resubmissions, "
        f"{tally.reconciled} reconciled attempts, {tally.same_receipt} with the uncrashed receipt"
    )
    assert tally.crashes == total + attempts
    assert tally.resubmissions == 0
    # Every lost answer, at least, is settled by asking the receiver.
    assert tally.reconciled >= attempts
    assert tally.same_receipt >= total - attempts  # the prefixes with nothing to reconcile


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_run_killed_between_its_claim_and_created_is_finished(backend: str, tmp_path: Path) -> None:
    """A worker is killed with SIGKILL right after it claimed the run's lease
    and before ``created`` was durable: nothing was sent. Another process
    finishes the run: ``resume`` starts it from the beginning (the lease taken
    over), and so does ``run_journaled`` under the same run id; each ends with
    the uncrashed run's receipt, every attempt sent once."""
    target = target_of(backend, tmp_path)
    store = open_store(backend, target)
    out = tmp_path / "out.json"
    tag = uuid.uuid4().hex[:8]
    with Receiver() as receiver:
        base_id = f"claimed-{tag}-base"
        receiver.scripts[base_id] = "reference"
        code, base = child("run", backend, target, base_id, receiver.url, out)
        assert code == 0 and base is not None and base["terminal"] == "completed"
        for mode in ("resume", "run"):
            run_id = f"claimed-{tag}-{mode}"
            receiver.scripts[run_id] = "reference"
            code, _ = child("run", backend, target, run_id, receiver.url, out, {"JOURNAL_KILL_AFTER_CLAIM": "1"})
            assert code == -signal.SIGKILL
            assert store.read(journal_log(run_id), 0) == []
            assert store.get(f"lease/{run_id}")[1] == 1  # claimed, never created
            assert receiver.received(run_id) == {}
            code, finished = child(mode, backend, target, run_id, receiver.url, out)
            assert code == 0 and finished is not None, run_id
            assert finished["terminal"] == "completed" and finished["lease_generation"] == 2
            assert finished["receipt_sha256"] == base["receipt_sha256"]
            events = [json.loads(e.text) for e in store.read(journal_log(run_id), 0)]
            assert events[0]["kind"] == "created" and events[0]["lease_generation"] == 2
            tally = Tally()
            check_resumed(tally, receiver, run_id, base, finished, events)
            assert tally.resubmissions == 0


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_fenced_owner_is_refused(backend: str, tmp_path: Path) -> None:
    """The old owner pauses after its last attempt's answer, a new process takes
    the run over and finishes it, then the old owner wakes up: its append is
    refused (lease check, then the store's seq), classified as evidence, and the
    journal is unchanged."""
    target = target_of(backend, tmp_path)
    store = open_store(backend, target)
    accepted = 0
    with Receiver() as receiver:
        for script, ordinal in (("reference", 3), ("fallback", 2)):
            run_id = f"fenced-{script}-{uuid.uuid4().hex[:8]}"
            receiver.scripts[run_id] = script
            pause = tmp_path / run_id.replace("/", "_")
            pause.mkdir()
            out_old, out_new = tmp_path / "old.json", tmp_path / "new.json"
            env = {**os.environ, "JOURNAL_PAUSE_AFTER_CALL": str(ordinal), "JOURNAL_PAUSE_DIR": str(pause)}
            old = subprocess.Popen(
                [sys.executable, str(CHILD), "run", backend, target, run_id, receiver.url, str(out_old)],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                deadline = time.monotonic() + 60
                while not (pause / "paused").exists():
                    assert old.poll() is None, old.stderr.read() if old.stderr else ""
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                code, resumed = child("resume", backend, target, run_id, receiver.url, out_new)
                assert code == 0 and resumed is not None
                before = [e.text for e in store.read(journal_log(run_id), 0)]
                (pause / "go").write_text("1")
                assert old.wait(timeout=60) == 0
            finally:
                if old.poll() is None:
                    old.kill()
            late = json.loads(out_old.read_text(encoding="utf-8"))
            assert late["lease_lost"] and late["code"] == "lease_lost"
            assert late["evidence"] is None  # the lease check stopped it before the store
            assert late["raw_append_ok"] is False  # and the store refuses the seq anyway
            accepted += int(bool(late["raw_append_ok"]))
            assert late["classified"]["kind"] == "evidence"
            assert late["classified"]["reason"] == "stale_lease"
            assert [e.text for e in store.read(journal_log(run_id), 0)] == before
            assert resumed["reconciled"] == [ordinal]
            assert receiver.received(run_id)[ordinal] == [200 if script == "reference" else 503]
    print(f"journal fencing test (python, {backend}): 2 late owners, {accepted} stale appends accepted")
    assert accepted == 0
