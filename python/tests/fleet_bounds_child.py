"""A child process for test_fleet_bounds.py: one of a fleet of processes
sharing one Redis store while the primary route is down.

    fleet_bounds_child.py <budget|probes> <redis-url> <namespace> <policy.json> <seconds> <ready-file> <go-file> <out.json> [<primary-url>]

Opens the store, writes <ready-file>, waits for <go-file> (at most 60 s),
then makes runs for <seconds>. The primary route fails every attempt
retryable ``unavailable``: ``budget`` fails it locally, ``probes`` sends it
as an HTTP request to <primary-url> (a loopback server answering 503). The
fallback serves. Writes to <out.json> what the sealed bundles say: runs,
terminals, first attempts (ordinal 1), later attempts (ordinal > 1: retries
and fallbacks), budget deposits and withdrawals, probes, primary dispatches,
and how many of the first bundles verify.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import retryledger  # noqa: E402
from retryledger.fleet import Fleet  # noqa: E402
from retryledger.stores import RedisStore  # noqa: E402

PRIMARY = "private-primary"
#: How many bundles per process are checked with verify_bundle.
VERIFY = 5


def main(argv: List[str]) -> None:
    mode, url, ns, policy_path, seconds, ready, go, out = argv[1:9]
    primary_url = argv[9] if len(argv) > 9 else ""
    if mode not in ("budget", "probes"):
        raise SystemExit(f"unknown mode {mode}")
    from conftest import KEY

    policy = retryledger.Policy(Path(policy_path).read_text(encoding="utf-8"))
    fleet = Fleet(RedisStore(url=url), namespace=ns, max_conflicts=500)
    fleet.read_view(policy)  # connected before the start
    counts: Dict[str, Any] = {
        "runs": 0,
        "first_attempts": 0,
        "later_attempts": 0,
        "deposits": 0,
        "withdrawals": 0,
        "probes": 0,
        "primary_dispatches": 0,
        "verified": 0,
        "terminals": {},
    }

    def dispatch(step: retryledger.Step) -> str:
        if step.route_id != PRIMARY:
            return "done"
        counts["primary_dispatches"] += 1
        if mode == "probes":
            try:
                with urllib.request.urlopen(primary_url, timeout=10) as response:
                    response.read()
            except urllib.error.HTTPError as e:
                e.read()
                raise retryledger.AttemptError.retryable("unavailable")
            raise SystemExit("the primary answered; the outage is simulated as a 503")
        time.sleep(0.001)  # a failing call takes a little time
        raise retryledger.AttemptError.retryable("unavailable")

    # The control's policy has no fleet section: it runs without the fleet
    # (a fleet given to it would be refused, admission_unexpected).
    used = fleet if "fleet" in policy.document else None
    Path(ready).write_text("ready", encoding="utf-8")
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.001)
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        try:
            r = retryledger.run(policy, dispatch, KEY, fleet=used)
            terminal, bundle = r.terminal, r.bundle
        except retryledger.RunStoppedError as e:
            terminal, bundle = e.terminal, e.bundle
        counts["runs"] += 1
        counts["terminals"][terminal] = counts["terminals"].get(terminal, 0) + 1
        for attempt in bundle["attempts"]["attempts"]:
            if attempt["ordinal"] == 1:
                counts["first_attempts"] += 1
            else:
                counts["later_attempts"] += 1
            admission = attempt.get("admission", {})
            kind = admission.get("budget", {}).get("kind")
            counts["deposits"] += kind == "deposit"
            counts["withdrawals"] += kind == "withdraw"
            counts["probes"] += bool(admission.get("breaker", {}).get("probe"))
        if counts["runs"] <= VERIFY:
            counts["verified"] += retryledger.verify_bundle(json.dumps(bundle))["kind"] == "verified"
    Path(out).write_text(json.dumps(counts), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv)
