"""The fleet's two bounds, measured with 8 separate processes sharing one
Redis store (``REDIS_URL``) during a full outage of the primary route (every
attempt on it fails retryable ``unavailable``; the fallback serves):

1. the retry budget bounds retries and fallbacks by the first attempts
   admitted and the wall clock;
2. a half-open breaker has at most ``half_open_probes`` probes in flight at
   once across the fleet, while without the breaker the same fleet sends the
   down primary overlapping requests.

Each process is ``fleet_bounds_child.py``; they open the store, say they are
ready, and start together on a go file. ``pytest -s`` prints the figures."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Optional

import retryledger
from retryledger import AttemptError, RunStoppedError, Step
from retryledger.fleet import Fleet

from conftest import KEY, make_policy
from fleet_support import HERE, fleet_policy, make_store, namespace, redis_url

CHILD = HERE / "fleet_bounds_child.py"
WORKERS = 8
PRIMARY = "private-primary"
#: Shorter backoff than the reference policy's, so each process makes more runs.
BACKOFF = {"base_ms": 10, "max_ms": 100, "retry_after_cap_ms": 2000}
WAIT_S = 60


def run_fleet(
    mode: str, tmp: Path, ns: str, policy: Dict[str, Any], seconds: float, primary_url: str = "", label: str = ""
) -> Dict[str, Any]:
    """Start WORKERS child processes, wait until every one is ready, start
    them at once, wait for all (bounded). Returns their summed counts and the
    wall-clock span in ms from just before the start to the last exit."""
    work = tmp / (label or mode)
    work.mkdir()
    policy_path = work / "policy.json"
    policy_path.write_text(json.dumps(policy), encoding="utf-8")
    go = work / "go"
    readies = [work / f"ready-{i}" for i in range(WORKERS)]
    outs = [work / f"out-{i}.json" for i in range(WORKERS)]
    args = [mode, redis_url(), ns, str(policy_path), str(seconds)]
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), *args, str(ready), str(go), str(out), primary_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ready, out in zip(readies, outs)
    ]
    try:
        deadline = time.monotonic() + WAIT_S
        while not all(r.exists() for r in readies):
            failed = [c for c in children if c.poll() is not None]
            assert not failed, failed[0].communicate(timeout=WAIT_S)[1]
            assert time.monotonic() < deadline, "the children did not get ready in time"
            time.sleep(0.01)
        started_ms = time.time() * 1000
        go.write_text("go", encoding="utf-8")
        for child in children:
            _, err = child.communicate(timeout=WAIT_S)
            assert child.returncode == 0, err
        elapsed_ms = time.time() * 1000 - started_ms
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=WAIT_S)
    total: Dict[str, Any] = {"terminals": {}, "elapsed_ms": elapsed_ms}
    for out in outs:
        counts = json.loads(out.read_text(encoding="utf-8"))
        for name, value in counts.items():
            if name == "terminals":
                for terminal, n in value.items():
                    total["terminals"][terminal] = total["terminals"].get(terminal, 0) + n
            else:
                total[name] = total.get(name, 0) + value
    return total


RATIO_PERMILLE = 100
FLOOR_PER_SECOND = 1
MAX_TOKENS = 5
SCOPE = "tenant-7/outage"


def test_retries_stay_within_ratio_of_first_attempts_plus_floor(tmp_path: Path) -> None:
    """The budget starts absent (a balance of 0 tokens) and caps at
    MAX_TOKENS; the breaker needs 10^6 consecutive failures, so it never
    opens and only the budget limits retries. Every run's first attempt fails
    on the primary; its retry (primary) and fallback each withdraw a token.
    Counted from the sealed bundles: first attempts F (ordinal 1, each a
    deposit) and later attempts R (ordinal > 1: retries and fallbacks, each
    a withdrawal); T = the wall-clock span of the fleet in ms. Asserted, in
    integer milli-tokens:

        R * 1000 <= F * RATIO_PERMILLE + FLOOR_PER_SECOND * T + 0

    i.e. R <= F * 100 / 1000 + 1 * T / 1000 + 0 (initial balance). The store's
    budget snapshot agrees: deposits == F, withdrawals == R."""
    make_store("redis", tmp_path)  # fails under make, skips by hand, without REDIS_URL
    ns = namespace()
    budget = {
        "scope": SCOPE,
        "ratio_permille": RATIO_PERMILLE,
        "floor_per_second": FLOOR_PER_SECOND,
        "max_tokens": MAX_TOKENS,
    }
    breaker = {"consecutive_failures": 1_000_000, "half_open_probes": 1, "open_ms": 60_000}
    policy = fleet_policy(breaker=breaker, budget=budget, backoff=BACKOFF)
    total = run_fleet("budget", tmp_path, ns, policy, seconds=3.0)
    first, later, elapsed_ms = total["first_attempts"], total["later_attempts"], total["elapsed_ms"]
    bound_milli = first * RATIO_PERMILLE + FLOOR_PER_SECOND * elapsed_ms
    print(
        f"\nbudget: {WORKERS} processes, {total['runs']} runs in {elapsed_ms / 1000:.2f} s: "
        f"{first} first attempts, {later} retries/fallbacks "
        f"<= {first} * {RATIO_PERMILLE}/1000 + {FLOOR_PER_SECOND} * {elapsed_ms / 1000:.2f} s = "
        f"{bound_milli / 1000:.2f} (without the budget: {2 * first}); terminals {total['terminals']}"
    )
    assert total["runs"] == first and first >= 100, total
    assert total["verified"] == WORKERS * 5, total
    assert (total["deposits"], total["withdrawals"]) == (first, later), total
    assert later * 1000 <= bound_milli, (later, bound_milli)
    assert later >= 1, total
    assert total["terminals"].get("stop_retry_budget", 0) > 0, total  # the budget did refuse retries
    document = Fleet(make_store("redis", tmp_path), namespace=ns).budget(SCOPE)
    assert document is not None
    assert (document["deposits"], document["withdrawals"]) == (first, later)
    assert document["balance_milli"] <= MAX_TOKENS * 1000
    # The breaker stayed closed throughout: only the budget limited retries.
    release = policy["routes"][0]["route_release_sha256"]
    snapshot = Fleet(make_store("redis", tmp_path), namespace=ns).breaker(release)
    assert snapshot is not None and snapshot["state"] == "closed"


class Primary:
    """A loopback HTTP server standing in for the down primary: every request
    sleeps HOLD_S (so overlapping requests overlap in the handler) and
    answers 503. Counts requests and the most in flight at once."""

    HOLD_S = 0.05

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0
        primary = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                with primary.lock:
                    primary.in_flight += 1
                    primary.requests += 1
                    primary.max_in_flight = max(primary.max_in_flight, primary.in_flight)
                time.sleep(Primary.HOLD_S)
                with primary.lock:
                    primary.in_flight -= 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/primary"

    def reset(self) -> None:
        with self.lock:
            self.in_flight = self.max_in_flight = self.requests = 0

    def __enter__(self) -> "Primary":
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.thread is not None:
            self.thread.join(timeout=10)


HALF_OPEN_PROBES = 1
PROBE_BREAKER = {"consecutive_failures": 1, "half_open_probes": HALF_OPEN_PROBES, "open_ms": 500}


def test_at_most_half_open_probes_in_flight_across_the_fleet(tmp_path: Path) -> None:
    """The primary's breaker is opened (one failure, in this process) before
    the processes start, and its open_ms (500) elapses while they get ready;
    the primary keeps failing, so the breaker cycles open -> half-open ->
    (the probe fails) -> open and every request the primary receives is a
    half-open probe. Asserted: the server's most concurrent primary requests
    <= half_open_probes (1), and each request is a probe in a bundle. Control:
    the same fleet with the policy's breaker absent sends more than 1 at once."""
    store = make_store("redis", tmp_path)
    ns = namespace()
    policy = fleet_policy(breaker=PROBE_BREAKER, backoff=BACKOFF)
    release = policy["routes"][0]["route_release_sha256"]
    fleet = Fleet(store, namespace=ns)

    def down(step: Step) -> str:
        if step.route_id == PRIMARY:
            raise AttemptError.retryable("unavailable")
        return "done"

    try:
        retryledger.run(retryledger.Policy(policy), down, KEY, fleet=fleet)
    except RunStoppedError:
        pass
    opened = fleet.breaker(release)
    assert opened is not None and opened["state"] == "open", opened

    with Primary() as primary:
        total = run_fleet("probes", tmp_path, ns, policy, seconds=3.0, primary_url=primary.url)
        with_breaker = (primary.max_in_flight, primary.requests)
        print(
            f"\nprobes: {WORKERS} processes, {total['runs']} runs in {total['elapsed_ms'] / 1000:.2f} s, "
            f"breaker open from the start: {primary.requests} primary requests, {total['probes']} probes, "
            f"at most {primary.max_in_flight} in flight (half_open_probes {HALF_OPEN_PROBES}); "
            f"terminals {total['terminals']}"
        )
        assert primary.max_in_flight <= HALF_OPEN_PROBES, with_breaker
        assert primary.requests >= 2, with_breaker  # the breaker did go half-open, more than once
        assert total["probes"] == total["primary_dispatches"] == primary.requests, (total, with_breaker)
        assert total["verified"] == WORKERS * 5, total
        assert total["terminals"].get("completed", 0) == total["runs"], total

        # Control: no breaker, the same fleet and outage.
        primary.reset()
        control_ns = namespace()
        control = run_fleet(
            "probes", tmp_path, control_ns, make_policy(backoff=BACKOFF), 1.0, primary.url, label="control"
        )
        print(
            f"control without the breaker: {control['runs']} runs in {control['elapsed_ms'] / 1000:.2f} s, "
            f"{primary.requests} primary requests, at most {primary.max_in_flight} in flight"
        )
        assert primary.max_in_flight > HALF_OPEN_PROBES, (primary.max_in_flight, primary.requests)
        assert control["probes"] == 0 and control["primary_dispatches"] == primary.requests, control
