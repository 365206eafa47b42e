"""Every conformance vector in tests/vectors, read in place, gives byte-identical
results and the same error codes and paths through the Python binding (the
drivers' `drive` cases are replayed by test_drivers_vectors.py; tables.json,
which holds no cases, by test_tables.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

import retryledger
import retryledger.fleet
import retryledger.receiver

from conftest import ROOT

VECTORS = ROOT / "tests" / "vectors"
FILES = sorted(p for p in VECTORS.glob("*.json") if p.name != "tables.json")

def _bound(policy: retryledger.Policy) -> Dict[str, Any]:
    return {"policy": policy.document, "policy_sha256": policy.sha256}


OPS: Dict[str, Callable[[Dict[str, Any]], Any]] = {
    "machine": lambda i: retryledger.machine_transcript(i["policy"], i["options"], i.get("journal"), i["events"]),
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
    "next_repair": lambda i: retryledger.next_repair(
        i["links"], i["request_sha256"], i["idempotency_key_sha256"], i["started_at_ms"]
    ),
    "verify_repair_chain": lambda i: retryledger.verify_repair_chain(i["chain"]),
    "canonical_request": lambda i: retryledger.canonical_request(i["request"]),
    "request_sha256": lambda i: retryledger.request_sha256(i["request"]),
    "check_price_schedule": lambda i: retryledger.check_price_schedule(i["policy"], i["schedule"]),
    "price_cost": lambda i: retryledger.price_cost(i["schedule"], i["route_release_sha256"], i["usage"]),
    "lift_request": lambda i: retryledger.lift_request(i["call"], i["params"]),
    "build_policy": lambda i: retryledger.build_policy(i["request"], i["spec"]).document,
    "bind_policy_template": lambda i: _bound(
        retryledger.compile_policy_template(i["spec"]).bind(i["request"], i["idempotency_key_sha256"])
    ),
    "idempotency_key_sha256": lambda i: retryledger.idempotency_key_sha256(
        i["key"], tenant=i.get("tenant"), operation=i.get("operation")
    ),
    "stream_session": lambda i: _stream_session(i["policy"], i["script"]),
    "priced_session": lambda i: _stream_session(i["policy"], i["script"], i["schedule"]),
    "hedge_session": lambda i: _hedge_session(i["policy"], i["script"]),
    "job_session": lambda i: _stream_session(i["policy"], i["script"], jobs=True),
    "breaker_admit": lambda i: retryledger.breaker_admit(i["config"], i["snapshot"], i["now_epoch_ms"]),
    "breaker_record": lambda i: retryledger.breaker_record(
        i["config"], i["snapshot"], i["probe"], i["outcome"], i["now_epoch_ms"]
    ),
    "budget_deposit": lambda i: retryledger.budget_deposit(i["config"], i["snapshot"], i["now_epoch_ms"]),
    "budget_withdraw": lambda i: retryledger.budget_withdraw(i["config"], i["snapshot"], i["now_epoch_ms"]),
    "fleet_session": lambda i: _fleet_session(i["policy"], i["store"], i["script"]),
    "admission_admit": lambda i: retryledger.admission_admit(
        i["config"], i["snapshot"], i["now_epoch_ms"], i["queued_since_epoch_ms"], i["tokens"], i.get("tenant")
    ),
    "admission_release": lambda i: retryledger.admission_release(
        i["config"], i["snapshot"], i["now_epoch_ms"], i["reserved"], i.get("used")
    ),
    "admission_observe": lambda i: retryledger.admission_observe(
        i["config"], i["snapshot"], i["headers"], i["now_epoch_ms"]
    ),
    "key_pool_select": lambda i: retryledger.key_pool_select(
        i["config"], i.get("snapshot"), i["now_epoch_ms"], i.get("affinity")
    ),
    "key_pool_record": lambda i: retryledger.key_pool_record(
        i["config"], i.get("snapshot"), i["key_sha256"], i["outcome"], i["now_epoch_ms"], i.get("status")
    ),
    "key_sha256": lambda i: retryledger.key_sha256(i["secret"]),
    "check_idempotency_header": lambda i: retryledger.receiver.check_idempotency_header(i["raw"]),
    "http_request_sha256": lambda i: retryledger.receiver.http_request_sha256(
        i["method"], i["target"], i["body"].encode()
    ),
    # The headers as the core takes them (JSON text); the guard's
    # ``http_response_sha256`` writes a sequence of pairs as that text.
    "http_response_sha256": lambda i: retryledger._api.call(
        retryledger._core.http_response_sha256, i["status"], i["headers"], i["body"].encode()
    ),
    "journal_verify": lambda i: retryledger.journal.journal_verify(i["policy"], i["events"]),
    "journal_recover": lambda i: retryledger.journal.journal_recover(
        i["policy"], i["events"], i.get("reconciliation")
    ),
    "journal_append": lambda i: retryledger.journal.journal_append(
        i["policy"], i["events"], i["lease_generation"], i["entry"]
    ),
    "journal_classify": lambda i: retryledger.journal.journal_classify(i["policy"], i["events"], i["event"]),
    "idempotency_claim": lambda i: retryledger.journal.idempotency_claim(
        i["retention"], i.get("record"), i["request"], i["now_epoch_ms"]
    ),
    "idempotency_complete": lambda i: retryledger.journal.idempotency_complete(
        i["retention"], i["record"], i["completion"], i["now_epoch_ms"]
    ),
    "lower_request": lambda i: retryledger.lower_request(i["request"], i["release"], i["options"]),
    "route_capabilities": lambda i: retryledger.route_capabilities(i["request"], i["spec"]),
}


def _hedge_session(policy: Any, script: Any) -> Dict[str, Any]:
    """Replay a scripted hedged session as the core's ``hedge::script`` does
    (core/src/hedge.rs) through ``retryledger.HedgeSession``: each step an
    event at its run-clock time; then the attempts, receipt, sealed bundle's
    digest and its replay's verdict."""
    session = retryledger.HedgeSession(policy)
    first = session.next()
    steps: List[Dict[str, Any]] = []
    for step in json.loads(script):
        at = step.get("at", 0)
        if "start" in step:
            steps.append({"step": session.start_attempt(step["start"], at)})
        elif "observe" in step:
            steps.append(session.observe(step["observe"], at, step["facts"], step.get("cost")))
        elif "cancelled" in step:
            steps.append({"step": session.cancelled(step["cancelled"], at)})
        else:
            session.cancel(step["cancel_run"])
            steps.append({"step": session.next()})
    sealed = session.seal()
    return {
        "attempts": sealed["bundle"]["attempts"],
        "bundle_sha256": retryledger.digest(sealed["bundle_json"]),
        "next": first,
        "receipt": sealed["bundle"]["receipt"],
        "steps": steps,
        "verdict": retryledger.verify_bundle(sealed["bundle_json"]),
    }


def _fleet_session(policy: Any, store_doc: Any, script: Any) -> Dict[str, Any]:
    """Replay a scripted fleet session as the core's reference host loop does
    (core/src/lab.rs, ``fleet_drive``) against an in-memory store: read the
    view, admit, write back what changed; after each observation record the
    attempt's breaker."""
    call = retryledger._api.call
    compiled = retryledger.Policy(policy)
    store = json.loads(store_doc) if isinstance(store_doc, str) else store_doc
    steps_in = json.loads(script) if isinstance(script, str) else script
    breakers: Dict[str, Any] = dict(store.get("breakers", {}))
    budget: Any = store.get("budget")
    has_breaker = "breaker" in (compiled.document.get("fleet") or {})
    session = compiled.session()
    steps: List[Dict[str, Any]] = []
    now = 0
    epoch = 0
    for step in steps_in:
        if "admit" in step:
            epoch = step["admit"]
            plan = session.next()
            at_ms = max(plan.not_before_ms, now) if isinstance(plan, retryledger.Dispatch) else now
            now = at_ms
            view: Dict[str, Any] = {"breakers": dict(breakers)}
            if budget is not None:
                view["budget"] = budget
            if "store_down" in step:
                view["store_unavailable"] = True
            admitted = call(session.admit, at_ms, epoch, json.dumps(view))
            for b in admitted["writes"]["breakers"]:
                breakers[b["route_release_sha256"]] = b
            if admitted["writes"].get("budget") is not None:
                budget = admitted["writes"]["budget"]
            answer: Dict[str, Any] = {"decision": admitted["decision"]}
            if admitted.get("wait_until_epoch_ms") is not None:
                answer["wait_until_epoch_ms"] = admitted["wait_until_epoch_ms"]
            answer["writes"] = admitted["writes"]
            steps.append(answer)
        elif "observe" in step:
            o = step["observe"]
            started = now
            duration = int(o.get("duration_ms", 0))
            now = started + duration
            judgement = call(session.observe, started, now, None, retryledger.Facts(**o.get("facts", {})))
            recorded: Any = None
            attempts = session.attempts["attempts"]
            if attempts and has_breaker:
                release = attempts[-1]["route_release_sha256"]
                at = epoch + duration
                current = breakers.get(release)
                if current is None:
                    current = _fresh_breaker(release, at)
                recorded = call(session.breaker_after, json.dumps(current), at)
                breakers[release] = recorded
            steps.append({"breaker": recorded, "judgement": judgement.to_dict(), "next": session.next().to_dict()})
        elif "set" in step:
            doc = step["set"]
            if doc.get("schema") == "retryledger.retry_budget.v1":
                budget = doc
            else:
                breakers[doc["route_release_sha256"]] = doc
            steps.append({"set": True})
    sealed = call(session.seal)
    bundle_json = sealed.bundle_json
    return {
        "bundle_sha256": retryledger.digest(bundle_json),
        "receipt": sealed.receipt,
        "steps": steps,
        "store": {"breakers": dict(sorted(breakers.items())), "budget": budget},
        "verdict": retryledger.verify_bundle(bundle_json),
    }


def _fresh_breaker(release: str, now_epoch_ms: int) -> Dict[str, Any]:
    """A closed breaker with no history (the core's ``BreakerSnapshot::fresh``)."""
    return retryledger.fleet.fresh_breaker(release, now_epoch_ms)


def _stream_session(
    policy: Any, script: Any, schedule: Optional[str] = None, jobs: bool = False
) -> Dict[str, Any]:
    """Replay a scripted session as the core's reference host loop does
    (core/src/lab.rs, ``drive``) and answer what it answers: a streamed
    session, or (with a price schedule) a priced one."""
    compiled = retryledger.Policy(policy)
    steps = json.loads(script) if isinstance(script, str) else script
    session = compiled.session()
    if schedule is not None:
        session.set_price_schedule(schedule)
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
        for usage in step.get("usage", []):
            session.add_usage(json.dumps(usage))
        if "request_body_sha256" in step:
            session.set_request_body_sha256(step["request_body_sha256"])
        if "job" in step:
            session.set_job(step["job"].get("id"), step["job"].get("status"))
        if "reconciled" in step:
            session.set_reconciled(step["reconciled"])
        judgement = session.observe(started, now, step.get("cost"), facts=facts, deltas=step.get("deltas", []))
        judgements.append(judgement.to_dict())
        decisions.append(session.next().to_dict())
    sealed = session.seal()
    bundle_json = sealed.bundle_json
    if schedule is not None or jobs:
        # The bundle dict and its canonical JSON agree.
        assert retryledger.digest(sealed.bundle) == retryledger.digest(bundle_json)
        return {
            "attempts": sealed.bundle["attempts"],
            "bundle_sha256": retryledger.digest(bundle_json),
            "decisions": decisions,
            "judgements": judgements,
            "receipt": sealed.receipt,
            "verdict": retryledger.verify_bundle(bundle_json),
        }
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
