"""A child process for test_fleet_admission_bounds.py: one of a fleet of
processes sharing one Redis store and one loopback server under admission
limits.

    fleet_admission_child.py <redis-url> <namespace> <policy.json> <seconds> <ready-file> <go-file> <out.json> <server-url>

Opens the store, writes <ready-file>, waits for <go-file> (at most 60 s),
then makes runs one after another for <seconds>; each run's single attempt
is one HTTP request to <server-url> carrying ``X-Run: <pid>-<n>``. Writes to
<out.json> one row per run: its id, the wall clock (Unix ms) when ``run``
was called, its terminal, and its attempt's admission limits (queue wait,
admitted start), plus how many of the first bundles verify.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import retryledger  # noqa: E402
from retryledger.fleet import Fleet  # noqa: E402
from retryledger.stores import RedisStore  # noqa: E402

#: How many bundles per process are checked with verify_bundle.
VERIFY = 5


def main(argv: List[str]) -> None:
    url, ns, policy_path, seconds, ready, go, out, server = argv[1:9]
    from conftest import KEY

    policy = retryledger.Policy(Path(policy_path).read_text(encoding="utf-8"))
    fleet = Fleet(RedisStore(url=url), namespace=ns, max_conflicts=1000)
    fleet.read_view(policy)  # connected before the start
    rows: List[Dict[str, Any]] = []
    verified = 0
    failures: List[Dict[str, Any]] = []
    current = {"run": ""}

    def dispatch(step: retryledger.Step) -> str:
        request = urllib.request.Request(server, headers={"X-Run": current["run"]})
        with urllib.request.urlopen(request, timeout=30) as response:
            body: bytes = response.read()
            return body.decode()

    Path(ready).write_text("ready", encoding="utf-8")
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.001)
    end = time.monotonic() + float(seconds)
    n = 0
    while time.monotonic() < end:
        n += 1
        current["run"] = f"{os.getpid()}-{n}"
        called = time.time() * 1000
        try:
            r = retryledger.run(policy, dispatch, KEY, fleet=fleet)
            terminal, bundle = r.terminal, r.bundle
        except retryledger.RunStoppedError as e:
            terminal, bundle = e.terminal, e.bundle
        attempts = bundle["attempts"]["attempts"]
        limits = attempts[0]["admission"]["limits"] if attempts else None
        rows.append(
            {
                "run": current["run"],
                "called_epoch_ms": called,
                "terminal": terminal,
                "attempts": len(attempts),
                "limits": limits,
                "receipt_queue_wait_ms": bundle["receipt"]["fleet"]["queue_wait_ms"],
            }
        )
        if n <= VERIFY:
            verdict = retryledger.verify_bundle(json.dumps(bundle))
            verified += verdict["kind"] == "verified"
            if verdict["kind"] != "verified":
                failures.append({"verdict": verdict, "bundle": bundle})
    out_doc = {"rows": rows, "verified": verified, "conflicts": fleet.conflicts, "admissions": fleet.admissions, "failures": failures}
    Path(out).write_text(json.dumps(out_doc), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv)
