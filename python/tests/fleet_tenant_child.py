"""A child process for test_fleet_tenant_shares.py: one process of one
tenant, in a fleet of processes sharing one Redis store and one loopback
server under admission limits with tenant shares.

    fleet_tenant_child.py <redis-url> <namespace> <policy.json> <seconds> <ready-file> <go-file> <out.json> <server-url> <tenant> <calls-per-second> <threads>

Opens the store with ``Fleet(..., tenant=<tenant>)``, writes <ready-file>,
waits for <go-file> (at most 60 s), then for <seconds> each of <threads> threads
starts a run every 1 / <calls-per-second> s (at once when a run took
longer), so a process offers <threads> x <calls-per-second> runs a second
while a run waits for admission; each run's single
attempt is one HTTP request to <server-url> carrying ``X-Run: <pid>-<n>``
and ``X-Tenant: <tenant>``. Writes to <out.json> one row per run: its id,
when ``run`` was called (Unix ms), its terminal, and for a run the fleet
stopped the refusal its stop records; plus how many of the first bundles
verify.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import retryledger  # noqa: E402
from retryledger.fleet import Fleet  # noqa: E402
from retryledger.stores import RedisStore  # noqa: E402

#: How many bundles per process are checked with verify_bundle (the first
#: completed ones and the first stopped ones).
VERIFY = 3


def main(argv: List[str]) -> None:
    url, ns, policy_path, seconds, ready, go, out, server, tenant, rate, threads = argv[1:12]
    from conftest import KEY

    policy = retryledger.Policy(Path(policy_path).read_text(encoding="utf-8"))
    fleet = Fleet(RedisStore(url=url), namespace=ns, max_conflicts=1000, tenant=tenant)
    fleet.read_view(policy)  # connected before the start
    rows: List[Dict[str, Any]] = []
    verified: Dict[str, int] = {}
    failures: List[Dict[str, Any]] = []
    period = 1.0 / float(rate)
    lock = threading.Lock()
    errors: List[BaseException] = []

    Path(ready).write_text("ready", encoding="utf-8")
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.001)
    start = time.monotonic()
    end = start + float(seconds)

    def worker(k: int) -> None:
        # Each thread starts its runs offset by a share of the period.
        first = start + period * k / int(threads)
        n = 0
        while True:
            due = first + n * period
            now = time.monotonic()
            if due >= end:
                break
            if due > now:
                time.sleep(due - now)
            n += 1
            run_id = f"{os.getpid()}-{k}-{n}"

            def dispatch(step: retryledger.Step) -> str:
                request = urllib.request.Request(server, headers={"X-Run": run_id, "X-Tenant": tenant})
                with urllib.request.urlopen(request, timeout=30) as response:
                    body: bytes = response.read()
                    return body.decode()

            called = time.time() * 1000
            try:
                r = retryledger.run(policy, dispatch, KEY, fleet=fleet)
                terminal, bundle = r.terminal, r.bundle
            except retryledger.RunStoppedError as e:
                terminal, bundle = e.terminal, e.bundle
            stop = bundle["attempts"].get("fleet_stop")
            refusal = stop["limits"].get("refusal") if stop is not None and "limits" in stop else None
            row = {
                "run": run_id,
                "called_epoch_ms": called,
                "terminal": terminal,
                "refusal": refusal,
                "attempts": len(bundle["attempts"]["attempts"]),
                "stop": stop,
            }
            with lock:
                rows.append(row)
                check = verified.get(terminal, 0) < VERIFY
            if check:
                verdict = retryledger.verify_bundle(json.dumps(bundle))
                with lock:
                    if verdict["kind"] == "verified":
                        verified[terminal] = verified.get(terminal, 0) + 1
                    else:
                        failures.append({"verdict": verdict, "bundle": bundle})

    def guarded(k: int) -> None:
        try:
            worker(k)
        except BaseException as e:  # reported by the parent through the exit code
            with lock:
                errors.append(e)

    pool = [threading.Thread(target=guarded, args=(k,)) for k in range(int(threads))]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    if errors:
        raise errors[0]
    out_doc = {
        "tenant": tenant,
        "rows": rows,
        "verified": verified,
        "conflicts": fleet.conflicts,
        "admissions": fleet.admissions,
        "failures": failures,
    }
    Path(out).write_text(json.dumps(out_doc), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv)
