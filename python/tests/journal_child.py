"""A worker process for the journal crash tests (python/tests/test_journal_crash.py).

    journal_child.py run|resume <sqlite|postgres> <target> <run_id> <receiver_url> <out.json>

``run`` starts the run with a journal (retryledger.journaled.run_journaled),
``resume`` takes it over in a new process (retryledger.journaled.resume, with a
reconcile that asks the receiver by idempotency key). Every attempt is a POST
to the fake receiver, which answers by the run's script. The run clock is
virtual (sleep advances it, every call takes 100 ms) and starts, on resume,
where the journal left off, so a resumed run reads the clock an uncrashed
one would have read.

Crash points, from the environment:

* ``JOURNAL_KILL_AFTER_SEQ=k``: SIGKILL itself right after the event at seq k
  is durably appended;
* ``JOURNAL_KILL_AFTER_CLAIM=1``: SIGKILL itself right after the run's lease
  is claimed (its compare-and-set committed), before ``created`` is appended;
* ``JOURNAL_KILL_AFTER_CALL=n``: SIGKILL itself after attempt n's request was
  answered, before its observation is appended;
* ``JOURNAL_PAUSE_AFTER_CALL=n`` with ``JOURNAL_PAUSE_DIR``: after attempt n's
  answer, create ``paused`` there and wait for ``go``; then go on as the old
  owner (its appends must be refused) and also offer the observation raw to
  the store at its seq, recording what the store answered.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Optional, Union

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import retryledger  # noqa: E402
from retryledger.journal import journal_classify  # noqa: E402
from retryledger.journaled import (  # noqa: E402
    JournaledResult,
    JournaledStopError,
    JournalStep,
    LeaseLostError,
    journal_log,
    resume,
    run_journaled,
)
from retryledger.stores import PostgresStore, SQLiteStore  # noqa: E402

from conftest import KEY, make_policy  # noqa: E402

#: Unix ms of the virtual clock's origin.
T0 = 1_780_000_000_000
#: What every call takes on the virtual clock.
LATENCY_MS = 100


class VirtualClock:
    def __init__(self, start_ms: int) -> None:
        self.now = float(T0 + start_ms)

    def __call__(self) -> float:
        return self.now

    def sleep(self, ms: float) -> None:
        self.now += ms


def open_store(backend: str, target: str) -> Any:
    if backend == "sqlite":
        return SQLiteStore(target)
    if backend == "postgres":
        return PostgresStore(target)
    raise SystemExit(f"unknown backend {backend}")


def last_time(events: Any) -> int:
    """The latest run-clock time the journal records."""
    t = 0
    for e in events:
        if e["kind"] == "dispatched":
            t = max(t, e["started_at_ms"])
        if e["kind"] == "observed":
            t = max(t, e["attempt"]["completed_at_ms"])
    return t


class KillAfterClaim:
    """The store, but the process kills itself once a compare-and-set (the
    lease claim) has committed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def compare_and_set(self, key: str, expected: int, document: Dict[str, Any]) -> Any:
        answer = self.inner.compare_and_set(key, expected, document)
        if answer[0]:
            os.kill(os.getpid(), signal.SIGKILL)
        return answer


def env_int(name: str) -> Optional[int]:
    v = os.environ.get(name)
    return None if v is None or v == "" else int(v)


def main() -> None:
    mode, backend, target, run_id, url, out = sys.argv[1:7]
    store = open_store(backend, target)
    if env_int("JOURNAL_KILL_AFTER_CLAIM") == 1:
        store = KillAfterClaim(store)
    policy = retryledger.Policy(make_policy())
    kill_seq = env_int("JOURNAL_KILL_AFTER_SEQ")
    kill_call = env_int("JOURNAL_KILL_AFTER_CALL")
    pause_call = env_int("JOURNAL_PAUSE_AFTER_CALL")
    pause_dir = Path(os.environ.get("JOURNAL_PAUSE_DIR", "."))
    events = [json.loads(e.text) for e in store.read(journal_log(run_id), 0)]
    clock = VirtualClock(last_time(events) if mode == "resume" else 0)

    def on_append(event: Dict[str, Any]) -> None:
        if kill_seq is not None and event["seq"] == kill_seq:
            os.kill(os.getpid(), signal.SIGKILL)

    def dispatch(step: JournalStep) -> str:
        req = urllib.request.Request(
            f"{url}/attempt",
            data=b"{}",
            method="POST",
            headers={
                "Idempotency-Key": step.idempotency_key,
                "X-Run": run_id,
                "X-Ordinal": str(step.ordinal),
                "X-Route": step.route_id,
                "X-Route-Ordinal": str(step.route_ordinal),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, body = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode()
        clock.sleep(LATENCY_MS)
        if kill_call == step.ordinal:
            os.kill(os.getpid(), signal.SIGKILL)
        if pause_call == step.ordinal:
            (pause_dir / "paused").write_text("1")
            while not (pause_dir / "go").exists():
                time.sleep(0.02)
        if status == 200:
            step.charge(step.reserve_cost)
            return str(body)
        step.charge(0)
        if status == 429:
            raise retryledger.AttemptError.retryable("rate_limited", retry_after_ms=250)
        raise retryledger.AttemptError.retryable("unavailable")

    def reconcile(attempt: Dict[str, Any]) -> Union[str, Dict[str, Any]]:
        q = f"{url}/status?run={run_id}&ordinal={attempt['ordinal']}"
        req = urllib.request.Request(q, headers={"Idempotency-Key": attempt["idempotency_key"]})
        with urllib.request.urlopen(req, timeout=10) as r:
            answer: Dict[str, Any] = json.loads(r.read().decode())
        return answer

    result: Dict[str, Any]
    try:
        if mode == "run":
            r: JournaledResult[str] = run_journaled(
                policy, dispatch, KEY, store=store, run_id=run_id, clock=clock, sleep=clock.sleep, on_append=on_append
            )
        else:
            r = resume(
                policy,
                dispatch,
                KEY,
                store=store,
                run_id=run_id,
                reconcile=reconcile,
                clock=clock,
                sleep=clock.sleep,
                on_append=on_append,
            )
        result = {"terminal": r.terminal, "receipt_sha256": r.receipt_sha256, "bundle": r.bundle_json,
                  "reconciled": r.reconciled, "value": r.value, "lease_generation": r.lease_generation}
    except JournaledStopError as e:
        result = {"terminal": e.terminal, "receipt_sha256": e.receipt_sha256, "bundle": e.bundle_json,
                  "reconciled": e.reconciled, "value": None, "lease_generation": e.lease_generation}
    except LeaseLostError as e:
        # The fenced old owner: offer its event to the store anyway, as a
        # late writer that skipped the lease check would.
        held = [json.loads(x.text) for x in store.read(journal_log(run_id), 0)]
        raw_ok = None
        classified = None
        if e.event is not None:
            text = json.dumps(e.event, separators=(",", ":"), ensure_ascii=False)
            raw_ok = store.append(journal_log(run_id), e.seq, text).ok
            classified = journal_classify(policy, held, e.event)
        result = {"lease_lost": True, "code": e.code, "seq": e.seq, "evidence": e.evidence,
                  "raw_append_ok": raw_ok, "classified": classified}
    Path(out).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
