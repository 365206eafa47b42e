"""A policy template compiled once and bound per call gives build_policy's
document and digest on every builder and preset vector; ``@retry(template)``
decorates a function once at module level."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

import retryledger

ROOT = Path(__file__).resolve().parents[2]
CASES: List[Dict[str, Any]] = [
    c
    for name in ("builder.json", "preset.json")
    for c in json.loads((ROOT / "tests/vectors" / name).read_text())["cases"]
    if c["op"] == "build_policy" and "idempotency_key_sha256" in json.loads(c["input"]["spec"])
]


def test_enough_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bind_equals_build_policy(case: Dict[str, Any]) -> None:
    spec = json.loads(case["input"]["spec"])
    key = spec.pop("idempotency_key_sha256")
    expect = case["expect"]
    try:
        policy = retryledger.compile_policy_template(spec).bind(case["input"]["request"], key)
    except retryledger.RetryledgerError as e:
        assert "error" in expect, f"template refused what build_policy accepts: {e.code}"
        assert e.code == expect["error"]["code"]
        return
    assert "ok" in expect, "template accepted what build_policy refuses"
    assert policy.document == expect["ok"]
    assert policy.sha256 == retryledger.digest(expect["ok"])
    assert policy.json == retryledger.build_policy(case["input"]["request"], case["input"]["spec"]).json


SPEC = {
    "schema": "retryledger.policy_spec.v1",
    "preset": "interactive",
    "routes": [
        {"provider": "openai", "model": "gpt-4.1-mini", "base_url": "http://127.0.0.1:9/v1", "price": {"input": 400000, "output": 1600000}},
        {"provider": "anthropic", "model": "claude-3-5-haiku", "base_url": "http://127.0.0.1:9/a", "price": {"input": 800000, "output": 4000000}},
    ],
}
TEMPLATE = retryledger.compile_policy_template(SPEC)
SENT: List[str] = []
NOW = [0.0]


class Unavailable(Exception):
    status_code = 503


def _sleep(ms: float) -> None:
    NOW[0] += ms


def _request(text: str) -> Dict[str, Any]:
    return {"schema": "retryledger.request.v1", "operation": "chat", "input": [text]}


@retryledger.retry(
    TEMPLATE, idempotency_key=lambda text: "k-" + text, request=_request, clock=lambda: NOW[0], sleep=_sleep
)
def summarize(step: retryledger.Step, text: str) -> str:
    SENT.append(step.route_id)
    if len(SENT) == 1:
        raise Unavailable()
    return text.upper()


def test_decorated_once_each_call_bound_to_its_request() -> None:
    SENT.clear()
    first = summarize.run("a")
    assert first.value == "A" and SENT == ["openai/gpt-4.1-mini", "openai/gpt-4.1-mini"]
    second = summarize.run("b")
    p1 = json.loads(first.bundle_json)["policy"]
    p2 = json.loads(second.bundle_json)["policy"]
    assert p1["logical_request_sha256"] == retryledger.request_sha256(_request("a"))
    assert p2["logical_request_sha256"] == retryledger.request_sha256(_request("b"))
    assert p2["idempotency_key_sha256"] == retryledger.idempotency_key_sha256("k-b")
    assert retryledger.verify_bundle(second.bundle_json)["kind"] == "verified"


def test_template_without_request_is_refused() -> None:
    f = retryledger.retry(TEMPLATE, idempotency_key="k")(lambda step: "x")
    with pytest.raises(TypeError):
        f()
