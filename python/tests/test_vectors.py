"""Every conformance vector in tests/vectors, read in place, gives byte-identical
results and the same error codes and paths through the Python binding (the
drivers' `drive` cases are replayed by test_drivers_vectors.py; tables.json,
which holds no cases, by test_tables.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

import retryledger

from conftest import ROOT

VECTORS = ROOT / "tests" / "vectors"
FILES = sorted(p for p in VECTORS.glob("*.json") if p.name != "tables.json")

OPS: Dict[str, Callable[[Dict[str, Any]], Any]] = {
    "validate_policy": lambda i: retryledger.validate_policy(i["policy"]),
    "plan_next": lambda i: retryledger.plan_next(i["policy"], i["attempts"]),
    "evaluate": lambda i: retryledger.evaluate(i["policy"], i["attempts"]),
    "verify_bundle": lambda i: retryledger.verify_bundle(i["bundle"]),
    "digest": lambda i: retryledger.digest(i["document"]),
    "parse_retry_after": lambda i: retryledger.parse_retry_after(
        i["header"], i["value"], i["now_unix_ms"], i["cap_ms"]
    ),
    "classify_http": lambda i: retryledger.classify_http(i["observation"]),
    "judge": lambda i: retryledger.judge(i["facts"]),
    "canonical_request": lambda i: retryledger.canonical_request(i["request"]),
    "request_sha256": lambda i: retryledger.request_sha256(i["request"]),
    "check_price_schedule": lambda i: retryledger.check_price_schedule(i["policy"], i["schedule"]),
    "price_cost": lambda i: retryledger.price_cost(i["schedule"], i["route_release_sha256"], i["usage"]),
    "lift_request": lambda i: retryledger.lift_request(i["call"], i["params"]),
    "build_policy": lambda i: retryledger.build_policy(i["request"], i["spec"]).document,
    "idempotency_key_sha256": lambda i: retryledger.idempotency_key_sha256(
        i["key"], tenant=i.get("tenant"), operation=i.get("operation")
    ),
    "stream_session": lambda i: _stream_session(i["policy"], i["script"]),
}


def _stream_session(policy: Any, script: Any) -> Dict[str, Any]:
    """Replay a scripted streamed session as the core's reference host loop
    does (core/src/lab.rs, ``drive_stream``) and answer what it answers."""
    compiled = retryledger.Policy(policy)
    steps = json.loads(script) if isinstance(script, str) else script
    session = compiled.session()
    judgements: List[Dict[str, Any]] = []
    decisions: List[Dict[str, Any]] = []
    now = 0
    for step in steps:
        if "cancel" in step:
            session.cancel(now)
            decisions.append(session.next().to_dict())
            continue
        plan = session.next()
        not_before = plan.not_before_ms if isinstance(plan, retryledger.Dispatch) else now
        started = max(not_before, now) + int(step.get("lag_ms", 0))
        now = started + int(step.get("duration_ms", 0))
        facts = retryledger.Facts(**step.get("facts", {}))
        judgement = session.observe(started, now, step.get("cost"), facts=facts, deltas=step.get("deltas", []))
        judgements.append(judgement.to_dict())
        decisions.append(session.next().to_dict())
    sealed = session.seal()
    bundle_json = sealed.bundle_json
    return {
        "bundle_sha256": retryledger.digest(bundle_json),
        "decisions": decisions,
        "judgements": judgements,
        "receipt": sealed.receipt,
        "stream_events": sealed.bundle.get("stream_events"),
        "verdict": retryledger.verify_bundle(bundle_json),
    }


def _cases() -> List[Tuple[str, Dict[str, Any]]]:
    cases = []
    for path in FILES:
        doc = json.loads(path.read_text(encoding="utf-8"))
        assert doc["schema"] == "retryledger.vectors.v1", path
        for case in doc["cases"]:
            if case["op"] == "drive":
                continue
            cases.append((f"{path.stem}:{case['name']}", case))
    return cases


CASES = _cases()


def dump(value: Any) -> str:
    """Compact JSON in the key order the value holds (no sorting): the core
    emits canonical (RFC 8785) order, dicts keep it, and so must the files."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_vectors_are_present() -> None:
    # Never pass vacuously: the vector files must be there, with cases.
    assert FILES, f"no vector files in {VECTORS}"
    assert len(CASES) > 0


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_vector(case: Dict[str, Any]) -> None:
    op = OPS[case["op"]]
    expect = case["expect"]
    if "ok" in expect:
        got = dump(op(case["input"]))
        assert got == dump(expect["ok"])
        assert got == json.dumps(expect["ok"], separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    else:
        with pytest.raises(retryledger.RetryledgerError) as info:
            op(case["input"])
        want = expect["error"]
        assert info.value.code == want["code"]
        assert info.value.path == want.get("path")
