"""The Session as a host drives it: decisions as frozen objects, facts validated
by the core's decoder with its codes, judgements, cancellation and the seal."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest

import retryledger
from retryledger import Dispatch, Facts, Terminal

from conftest import KEY, FakeClock, make_policy, reference_bundle


def test_a_session_reproduces_the_reference_bundle() -> None:
    expected = reference_bundle()
    policy = retryledger.Policy(expected["policy"])
    session = policy.session()
    for attempt in expected["attempts"]["attempts"]:
        plan = session.next()
        assert isinstance(plan, Dispatch) and plan.kind == "dispatch"
        decision = plan.to_dict()
        assert decision == policy.plan_next(session.attempts)
        assert decision["ordinal"] == plan.ordinal == attempt["ordinal"]
        assert plan.route_id == attempt["route_id"] and plan.route_ordinal == attempt["route_ordinal"]
        facts = Facts(result="returned") if attempt["outcome"]["class"] == "success" else Facts(
            result="raised", outcome=attempt["outcome"]
        )
        judgement = session.observe(
            started_at_ms=attempt["started_at_ms"],
            completed_at_ms=attempt["completed_at_ms"],
            cost=attempt["cost"],
            facts=facts,
        )
        assert judgement.outcome.to_dict() == attempt["outcome"]
        assert judgement.rule in ("returned", "explicit")
    end = session.next()
    assert isinstance(end, Terminal) and end.terminal == session.terminal == "completed"
    assert end.to_dict() == {"kind": "terminal", "terminal": "completed"}
    sealed = session.seal()
    assert sealed.bundle == expected
    assert sealed.receipt == expected["receipt"] and sealed.receipt is sealed.receipt
    assert sealed.receipt_sha256 == retryledger.digest(expected["receipt"])
    assert retryledger.verify_bundle(sealed.bundle_json)["kind"] == "verified"


@pytest.mark.parametrize(
    ("fields", "code", "path"),
    [
        ({"result": "maybe"}, "invalid_value", "/result"),
        ({"result": 1}, "invalid_type", "/result"),
        ({"result": "raised", "status": 600}, "invalid_status", "/status"),
        ({"result": "raised", "status": True}, "invalid_type", "/status"),
        ({"result": "raised", "status": 429.0}, "float_value", "/status"),
        ({"result": "raised", "now_unix_ms": 2**53}, "integer_out_of_range", "/now_unix_ms"),
        ({"result": "raised", "now_unix_ms": -1}, "integer_out_of_range", "/now_unix_ms"),
        ({"result": "raised", "error_types": ["X"] * 33}, "too_many_items", "/error_types"),
        ({"result": "raised", "error_codes": ["E" * 257]}, "string_too_long", "/error_codes/0"),
        ({"result": "raised", "error_types": "X"}, "invalid_type", "/error_types"),
        ({"result": "raised", "headers": [["retry-after"]]}, "invalid_value", "/headers/0"),
        ({"result": "raised", "transport_error": "dns"}, "invalid_value", "/transport_error"),
        ({"result": "raised", "outcome": {"class": "retryable", "kind": "sleepy"}}, "invalid_value", "/outcome"),
        ({"result": "raised", "cancelled": "yes"}, "invalid_type", "/cancelled"),
    ],
)
def test_facts_are_validated_with_the_core_codes(fields: Dict[str, Any], code: str, path: str) -> None:
    with pytest.raises(retryledger.RetryledgerError) as info:
        Facts(**fields)
    assert (info.value.code, info.value.path) == (code, path)


def test_facts_and_judge() -> None:
    facts = Facts(result="raised", status=429, headers={"Retry-After": "2"}, error_types=["RateLimitError"])
    assert facts.to_dict() == {
        "error_types": ["RateLimitError"],
        "headers": [["Retry-After", "2"]],
        "result": "raised",
        "status": 429,
    }
    expected = {"outcome": {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 2_000}, "rule": "status"}
    assert retryledger.judge(facts) == expected == retryledger.judge(facts.json)


def test_observe_checks_its_arguments_and_drift() -> None:
    session = retryledger.Policy(make_policy()).session()
    with pytest.raises(retryledger.DecodeError) as info:
        session.observe(started_at_ms=0, completed_at_ms=1)
    assert info.value.code == "missing_field"
    with pytest.raises(retryledger.DecodeError) as info:
        session.observe(started_at_ms=-1, completed_at_ms=1, facts=Facts(result="returned"))
    assert (info.value.code, info.value.path) == ("integer_out_of_range", "/started_at_ms")
    with pytest.raises(retryledger.DriftError) as drift:
        session.observe(started_at_ms=5, completed_at_ms=4, facts=Facts(result="returned"))
    assert drift.value.code == "completed_before_started"
    assert session.attempts["attempts"] == []
    with pytest.raises(retryledger.RunError):
        session.seal()
    session.cancel(3)
    assert session.terminal == "stop_cancelled"
    assert session.seal().attempts == {"attempts": [], "cancelled_at_ms": 3, "schema": "retryledger.attempts.v1"}


def test_on_attempt_sees_each_attempt_and_its_judgement() -> None:
    seen: List[Tuple[int, str]] = []
    clock = FakeClock()

    def dispatch(step: retryledger.Step) -> str:
        if step.ordinal == 1:
            raise retryledger.AttemptError.retryable("unavailable")
        return "ok"

    result = retryledger.run(
        make_policy(),
        dispatch,
        KEY,
        clock=clock,
        sleep=clock.sleep,
        on_attempt=lambda attempt, judgement: seen.append((attempt["ordinal"], judgement.rule)),
    )
    assert result.value == "ok" and seen == [(1, "explicit"), (2, "returned")]


def test_facts_observed_again_share_their_judgement_only_when_it_is_the_same() -> None:
    policy = retryledger.Policy(make_policy())
    # An error raised twice: one judgement object, the core's each time.
    failure = Facts(result="raised", outcome={"class": "retryable", "kind": "unavailable"})
    session = policy.session()

    def observe() -> Any:
        plan = session.next()
        assert isinstance(plan, Dispatch)
        at = plan.not_before_ms
        return session.observe(started_at_ms=at, completed_at_ms=at, facts=failure)

    first = observe()
    second = observe()
    assert second is first
    assert first.rule == "explicit"
    assert first.outcome.to_dict() == {"class": "retryable", "kind": "unavailable"}
    # The same facts judged otherwise (after the deadline, then before it): each its own judgement.
    mystery = Facts(result="raised", error_types=["MysteryError"])
    late, early = policy.session(), policy.session()
    plan = late.next()
    assert isinstance(plan, Dispatch)
    after = late.observe(started_at_ms=0, completed_at_ms=plan.deadline_ms, facts=mystery)
    before = early.observe(started_at_ms=0, completed_at_ms=0, facts=mystery)
    assert (after.rule, before.rule) == ("deadline", "unrecognized")
    assert before is not after
    assert before.to_dict() == retryledger.judge(mystery.json) and before.outcome != after.outcome
