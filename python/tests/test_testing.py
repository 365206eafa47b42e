"""The testing kit: a fake clock, a seeded fault injector for dispatch
functions and httpx transports; injected failures go through the core's rules
and the receipt counts them. The README's example runs here."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from typing import Any, Dict, List, Optional, Tuple

import httpx
import pytest

import retryledger
import retryledger.httpx as rl_httpx
from retryledger import Step
from retryledger.httpx import FaultTransport
from retryledger.testing import FakeClock, FaultPlanError, InjectedFault, inject_faults

from conftest import KEY, ROOT, make_policy
from loopback import ScriptedServer


def patient_policy(key: str = KEY) -> Dict[str, Any]:
    """The reference policy with room for two 30 s waits on the primary."""
    policy = make_policy(deadline_ms=120_000, max_total_attempts=4)
    policy["backoff"]["retry_after_cap_ms"] = 30_000
    policy["routes"][0]["max_attempts"] = 3
    policy["idempotency_key_sha256"] = hashlib.sha256(key.encode()).hexdigest()
    return policy


def test_the_readme_example_takes_60_s_of_backoff_in_well_under_a_second() -> None:
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"```python\nfrom retryledger\.testing import FakeClock, inject_faults\n\n(.*?)```", readme, re.S)
    assert m, "README shows the testing example"
    scope: Dict[str, Any] = {
        "retryledger": retryledger,
        "FakeClock": FakeClock,
        "inject_faults": inject_faults,
        "policy": patient_policy("order-7"),
    }
    started = time.monotonic()
    exec(compile(m.group(1), "README.md", "exec"), scope)
    assert time.monotonic() - started < 1.0
    result = scope["result"]
    assert [a.get("injected_fault") for a in result.bundle["attempts"]["attempts"]] == [True, True, None]
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"


#: The first 40 calls under rates unavailable 0.3, timeout 0.2, seed 42
#: (`.` the real call, `u` unavailable, `t` timeout): the same in both kits.
SEED_42_PATTERN = ".t..u.u..tu..tu...ut.u.uuuu..uu.t.ttuu.."


CASES: List[Tuple[Dict[str, Any], str, Optional[int]]] = [
    ({"kind": "rate_limited", "retry_after_ms": 250}, "rate_limited", 250),
    ({"kind": "rate_limited", "retry_after": "2"}, "rate_limited", 2000),
    ({"kind": "unavailable"}, "unavailable", None),
    ({"kind": "overloaded"}, "unavailable", None),
    ({"kind": "timeout"}, "timeout_before_response", None),
    ({"kind": "reset"}, "unknown_provider_acceptance", None),
]


@pytest.mark.parametrize("fault,kind,hint", CASES)
def test_every_fault_kind_is_judged_like_a_real_failure_and_marked(fault: Dict[str, Any], kind: str, hint: Optional[int]) -> None:
    clock = FakeClock()
    dispatch = inject_faults(lambda step: "ok", script=[fault], clock=clock, latency_ms=20)
    try:
        attempts = retryledger.run(patient_policy(), dispatch, KEY, clock=clock, sleep=clock.sleep).bundle["attempts"]
    except retryledger.RunStoppedError as stopped:
        attempts = stopped.bundle["attempts"]
    first = attempts["attempts"][0]
    assert first["injected_fault"] is True
    assert first["outcome"].get("kind") == kind
    assert first["outcome"].get("retry_after_ms") == hint
    assert first["completed_at_ms"] - first["started_at_ms"] == 20
    assert dispatch.injected == 1


def test_the_async_driver_and_an_async_dispatch() -> None:
    clock = FakeClock()

    async def answer(step: Step) -> str:
        return "summary"

    dispatch = inject_faults(answer, script=[{"kind": "unavailable", "retry_after_ms": 100}], clock=clock)
    result = asyncio.run(retryledger.run_async(patient_policy(), dispatch, KEY, clock=clock, sleep=clock.async_sleep))
    assert result.value == "summary"
    assert result.receipt["injected_faults"] == 1


def test_by_rate_the_same_seed_injects_the_same_faults_and_slow_only_advances_the_clock() -> None:
    def pattern() -> List[str]:
        dispatch = inject_faults(lambda step: "ok", rates={"unavailable": 0.3, "timeout": 0.2}, seed=42)
        out = []
        for _ in range(200):
            try:
                dispatch(None)
                out.append("ok")
            except InjectedFault as f:
                out.append(f.fault["kind"])
        return out

    a = pattern()
    assert pattern() == a
    # The TypeScript kit draws the same faults from the same seed
    # (wasm/test/testing.test.mjs pins the same 40 calls).
    assert "".join("." if k == "ok" else k[0] for k in a[:40]) == SEED_42_PATTERN
    assert 35 < a.count("unavailable") < 85
    assert 20 < a.count("timeout") < 60
    clock = FakeClock()
    slow = inject_faults(lambda step: "ok", script=[{"kind": "slow", "ms": 700}], clock=clock)
    assert slow(None) == "ok"
    assert clock.now == 700 and slow.injected == 0


@pytest.mark.parametrize(
    "plan",
    [
        {"rates": {"unavailable": 1.5}},
        {"rates": {"unavailable": -0.1}},
        {"rates": {"unavailable": 0.6, "reset": 0.6}},
        {"rates": {"gremlins": 0.1}},
        {"seed": 1.5},
        {"script": [{"kind": "slow", "ms": -1}]},
        {"script": [{"kind": "meteor"}]},
    ],
)
def test_a_plan_that_cannot_be_used_is_a_coded_error(plan: Dict[str, Any]) -> None:
    with pytest.raises(FaultPlanError) as raised:
        inject_faults(lambda step: "ok", **plan)
    assert raised.value.code == "invalid_fault_plan"


def test_the_httpx_transport_injects_answers_and_connection_faults_in_front_of_a_real_server() -> None:
    server = ScriptedServer({"primary": [(200, {})], "fallback": [(200, {})]}, lambda status: {"ok": True}).start()
    try:
        clock = FakeClock()
        transport = FaultTransport(
            httpx.HTTPTransport(), script=[{"kind": "rate_limited", "retry_after_ms": 100}, {"kind": "reset"}], clock=clock
        )
        with httpx.Client(transport=transport) as client:
            with pytest.raises(retryledger.RunStoppedError) as stopped:
                rl_httpx.run(
                    patient_policy(),
                    client,
                    lambda c, step: c.post(server.url("primary") + "/v1/jobs", json={"incident": "INC-4471"}),
                    KEY,
                    clock=clock,
                    sleep=clock.sleep,
                )
        # The reset after sending is unknown acceptance: never retried.
        assert stopped.value.terminal == "stop_indeterminate"
        attempts = stopped.value.bundle["attempts"]["attempts"]
        assert [(a["injected_fault"], a["outcome"]["class"]) for a in attempts] == [(True, "retryable"), (True, "indeterminate")]
        assert stopped.value.receipt["injected_faults"] == 2
        assert server.count() == 0 and transport.injected == 2
    finally:
        server.stop()
