"""A policy built from a request and catalog documents, run with a scoped
idempotency key: the digests come from the core, the raw key from the caller."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import retryledger

ROOT = Path(__file__).resolve().parents[2]
CASES = json.loads((ROOT / "tests/vectors/builder.json").read_text())["cases"]
BASE = next(c for c in CASES if c["name"] == "build_reference_spec")


def built(tenant: str, operation: str, key: str) -> retryledger.Policy:
    spec = json.loads(BASE["input"]["spec"])
    spec["idempotency_key_sha256"] = retryledger.idempotency_key_sha256(key, tenant=tenant, operation=operation)
    request = json.loads(BASE["input"]["request"])
    return retryledger.build_policy(request, spec)


def test_a_built_policy_runs_with_its_scoped_key() -> None:
    policy = built("tenant-a", "chat.completions", "order-7")
    assert policy.document["logical_request_sha256"] == retryledger.request_sha256(BASE["input"]["request"])
    now = [0.0]

    def sleep(ms: float) -> None:
        now[0] += ms

    def dispatch(step: retryledger.Step) -> str:
        assert step.idempotency_key == "order-7"
        return "ok"

    result = retryledger.run(
        policy, dispatch, "order-7", key_scope=("tenant-a", "chat.completions"), clock=lambda: now[0], sleep=sleep
    )
    assert result.value == "ok" and result.terminal == "completed"
    assert "order-7" not in result.bundle_json


@pytest.mark.parametrize(
    "key, scope",
    [("order-7", ("tenant-b", "chat.completions")), ("order-7", None), ("order-8", ("tenant-a", "chat.completions"))],
)
def test_another_scope_or_key_is_refused_before_dispatch(key: str, scope: Any) -> None:
    policy = built("tenant-a", "chat.completions", "order-7")
    with pytest.raises(retryledger.DriftError) as e:
        retryledger.run(policy, lambda step: pytest.fail("dispatched"), key, key_scope=scope)
    assert e.value.code == "idempotency_key_drift"


def test_builder_errors_are_validation_codes() -> None:
    spec = json.loads(BASE["input"]["spec"])
    spec["max_data_boundary"] = "private_service"
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.build_policy(BASE["input"]["request"], spec)
    assert e.value.code == "data_boundary_exceeded"
    with pytest.raises(retryledger.DecodeError) as d:
        retryledger.build_policy({"schema": "retryledger.request.v1", "operation": "x", "input": float("nan")}, spec)
    assert d.value.code == "invalid_json"


def test_the_integrations_pass_the_key_scope_through() -> None:
    import inspect

    import retryledger.anthropic
    import retryledger.httpx
    import retryledger.openai

    for module in (retryledger.openai, retryledger.anthropic, retryledger.httpx):
        for fn in (module.run, module.run_async):
            assert "key_scope" in inspect.signature(fn).parameters, f"{module.__name__}.{fn.__name__}"
    policy = built("tenant-a", "chat.completions", "order-7")
    with pytest.raises(retryledger.DriftError):
        clients = {r["route_id"]: SimpleNamespace(max_retries=0) for r in policy.document["routes"]}
        retryledger.openai.run(policy, clients, lambda c, s: None, "order-7", key_scope=("tenant-b", "chat.completions"))
