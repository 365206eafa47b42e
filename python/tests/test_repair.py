"""Output checks and bounded repair through the drivers (docs/REPAIR.md):
the verdicts of real validators (pydantic, jsonschema, functions) judged by
the core, refusals that never fall back, validators that break, and chains of
repairs that the core's replay verifies."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any, Dict, List, Optional, Tuple

import pytest
from pydantic import BaseModel

import retryledger
from retryledger import checks

from conftest import KEY, FakeClock, make_policy


class Summary(BaseModel):
    title: str
    severity: int


GOOD = '{"title": "disk full", "severity": 2}'
MISSING = '{"title": "disk full"}'


def request(text: str) -> Dict[str, Any]:
    return {"schema": "retryledger.request.v1", "operation": "chat", "input": [{"role": "user", "content": text}]}


def repaired_policy(max_repairs: int = 2, share: int = 50) -> Dict[str, Any]:
    return make_policy(repair={"max_repairs": max_repairs, "cost_share_percent": share})


class Script:
    """Answers in order; each attempt's step is kept."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.steps: List[retryledger.Step] = []

    def __call__(self, step: retryledger.Step) -> Any:
        self.steps.append(step)
        answer = self.answers[len(self.steps) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def run(policy: Dict[str, Any], script: Script, **options: Any) -> retryledger.RunResult[Any]:
    clock = FakeClock()
    return retryledger.run(policy, script, KEY, clock=clock, sleep=clock.sleep, **options)


def stopped(policy: Dict[str, Any], script: Script, **options: Any) -> retryledger.RunStoppedError:
    with pytest.raises(retryledger.RunStoppedError) as e:
        run(policy, script, **options)
    return e.value


def defects_sha256(defects: List[Dict[str, Any]]) -> str:
    """SHA-256 of the defects' canonical JSON (keys sorted, no spaces: ASCII here)."""
    text = json.dumps(defects, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


# ---- output checks -----------------------------------------------------------


def test_a_pydantic_failure_is_invalid_output_recorded_by_its_digest() -> None:
    error = stopped(make_policy(), Script(MISSING), checks=[checks.pydantic_model(Summary)])
    assert error.code == "stop_non_retryable"
    (attempt,) = error.bundle["attempts"]["attempts"]
    assert attempt["outcome"] == {"class": "non_retryable", "kind": "invalid_output"}
    record = attempt["output_check"]
    assert record["kind"] == "schema" and record["validator"] == "pydantic:Summary" and record["defect_count"] == 1
    assert record["defects_sha256"] == defects_sha256([{"message": "Field required", "path": "/severity"}])
    assert retryledger.verify_bundle(error.bundle_json)["kind"] == "verified"


def test_a_passing_check_completes_and_records_nothing() -> None:
    result = run(make_policy(), Script(GOOD), checks=[checks.pydantic_model(Summary)])
    assert result.value == GOOD
    assert "output_check" not in result.bundle["attempts"]["attempts"][0]


def test_a_refusal_stops_on_its_route_and_never_falls_back() -> None:
    refused = checks.function(lambda out: ["I can't help with that."] if out == "refused" else True, validator="refusal", kind="refusal")
    script = Script("refused", GOOD, GOOD)
    error = stopped(make_policy(), script, checks=[refused])
    assert error.code == "stop_non_retryable" and len(script.steps) == 1
    assert error.receipt["fallback_used"] is False
    assert error.bundle["attempts"]["attempts"][0]["outcome"]["kind"] == "policy_denied"


def test_json_schema_defects_and_unparsable_text() -> None:
    schema = {"type": "object", "required": ["title", "severity"], "properties": {"severity": {"type": "integer"}}}
    check = checks.json_schema(schema, validator="summary-schema")
    assert check(GOOD)["verdict"] == "pass"
    failed = check('{"title": "x", "severity": "high"}')
    assert failed["verdict"] == "defects" and failed["defects"][0]["path"] == "/severity"
    assert check('{"title": ')["kind"] == "unparsable_json"
    error = stopped(make_policy(), Script('{"title": '), checks=[check])
    assert error.bundle["attempts"]["attempts"][0]["output_check"]["kind"] == "unparsable_json"


def test_a_verdict_that_is_not_one_is_a_coded_error_and_the_attempt_is_recorded() -> None:
    broken = checks.function(lambda out: 42, validator="broken")
    script = Script(GOOD, GOOD)
    with pytest.raises(retryledger.UnrecognizedDispatchError) as e:
        run(make_policy(), script, checks=[broken])
    cause = e.value.__cause__
    assert isinstance(cause, retryledger.DecodeError) and cause.code == "output_verdict_invalid"
    assert len(script.steps) == 1 and e.value.receipt["attempt_count"] == 1
    assert e.value.bundle["attempts"]["attempts"][0]["outcome"]["class"] == "indeterminate"


def test_defects_over_the_bound_are_a_coded_error() -> None:
    many = checks.function(lambda out: [f"defect {i}" for i in range(65)], validator="many")
    with pytest.raises(retryledger.UnrecognizedDispatchError) as e:
        run(make_policy(), Script(GOOD), checks=[many])
    assert getattr(e.value.__cause__, "code", None) == "output_defects_over_bound"


# ---- repair -------------------------------------------------------------------


def fix(output: Any, defects: List[Dict[str, Any]]) -> Dict[str, Any]:
    return request(f"answer again; fix {json.dumps(defects, sort_keys=True)}")


def test_one_repair_completes_under_its_own_request_and_key() -> None:
    script = Script(MISSING, GOOD)
    seen: List[Tuple[Any, List[Dict[str, Any]]]] = []

    def repair(output: Any, defects: List[Dict[str, Any]]) -> Dict[str, Any]:
        seen.append((output, defects))
        return fix(output, defects)

    result = run(repaired_policy(), script, checks=[checks.pydantic_model(Summary)], repair=repair, request=request("summarize"))
    assert result.value == GOOD
    assert seen == [(MISSING, [{"kind": "schema", "validator": "pydantic:Summary", "message": "Field required", "path": "/severity"}])]
    first, second = script.steps
    assert (first.repair_ordinal, second.repair_ordinal) == (0, 1)
    assert first.request == request("summarize") and second.request == fix(MISSING, seen[0][1])
    assert second.idempotency_key == f"{KEY}:repair:1"
    assert result.chain is not None
    chain: Dict[str, Any] = result.chain
    root, link = chain["links"]
    assert link["parent_request_sha256"] == root["bundle"]["policy"]["logical_request_sha256"]
    assert link["bundle"]["policy"]["logical_request_sha256"] == retryledger.request_sha256(second.request)
    assert link["bundle"]["policy"]["logical_request_sha256"] != root["bundle"]["policy"]["logical_request_sha256"]
    verdict = retryledger.verify_repair_chain(chain)
    assert verdict["kind"] == "verified" and verdict["repairs"] == 1 and verdict["terminal"] == "completed"
    # The repair ran under what the core left it: the deadline and the cost share.
    assert link["bundle"]["policy"]["deadline_ms"] == 5000 - link["started_at_ms"]
    assert link["bundle"]["policy"]["max_total_cost"] == 5000


def test_repairs_stop_at_max_repairs_and_the_chain_says_so() -> None:
    script = Script(MISSING, MISSING, GOOD)
    error = stopped(repaired_policy(max_repairs=1), script, checks=[checks.pydantic_model(Summary)], repair=fix)
    assert error.code == "stop_non_retryable" and len(script.steps) == 2
    assert isinstance(error.__cause__, retryledger.DriftError) and error.__cause__.code == "repair_over_budget"
    assert error.repair_refused is error.__cause__
    assert error.chain is not None
    chain: Dict[str, Any] = error.chain
    assert [link.get("repair_ordinal") for link in chain["links"]] == [None, 1]
    assert retryledger.verify_repair_chain(chain)["kind"] == "verified"


def test_a_refusal_is_never_repaired() -> None:
    refused = checks.function(lambda out: "no", validator="refusal", kind="refusal")
    script = Script("refused", GOOD)
    repairs: List[Any] = []

    def repair(output: Any, defects: List[Dict[str, Any]]) -> Dict[str, Any]:
        repairs.append(output)
        return fix(output, defects)

    error = stopped(repaired_policy(), script, checks=[refused], repair=repair)
    assert repairs == [] and len(script.steps) == 1
    assert error.bundle["attempts"]["attempts"][0]["outcome"]["kind"] == "policy_denied"


def test_a_repair_of_the_same_request_is_refused_by_the_core() -> None:
    root = request("summarize")
    policy = repaired_policy()
    policy["logical_request_sha256"] = retryledger.request_sha256(root)
    error = stopped(
        policy, Script(MISSING, GOOD), checks=[checks.pydantic_model(Summary)],
        repair=lambda o, d: root, request=root,
    )
    assert getattr(error.__cause__, "code", None) == "repair_same_request"


@pytest.mark.parametrize(
    "repair",
    [
        pytest.param(lambda o, d: 1 / 0, id="raises"),
        pytest.param(lambda o, d: {"schema": "retryledger.request.v1", "operation": "chat", "input": [], "temperature": float("nan")}, id="not-canonical"),
    ],
)
def test_a_repair_function_that_fails_is_a_coded_error_with_the_chain(repair: Any) -> None:
    script = Script(MISSING, GOOD)
    with pytest.raises(retryledger.DecodeError) as e:
        run(repaired_policy(), script, checks=[checks.pydantic_model(Summary)], repair=repair)
    assert e.value.code == "repair_function_failed"
    chain: Dict[str, Any] = e.value.chain  # type: ignore[attr-defined]
    (root,) = chain["links"]
    assert len(root["bundle"]["attempts"]["attempts"]) == 1 == len(script.steps)
    assert retryledger.verify_repair_chain(chain)["kind"] == "verified"


def test_the_async_driver_repairs_too_with_an_async_repair_function() -> None:
    clock = FakeClock()
    answers = [MISSING, GOOD]
    steps: List[retryledger.Step] = []

    async def dispatch(step: retryledger.Step) -> str:
        steps.append(step)
        return answers[len(steps) - 1]

    async def sleep(ms: float) -> None:
        clock.sleep(ms)

    async def repair(output: Any, defects: List[Dict[str, Any]]) -> Dict[str, Any]:
        await asyncio.sleep(0)
        return fix(output, defects)

    result = asyncio.run(
        retryledger.run_async(
            repaired_policy(), dispatch, KEY, clock=clock, sleep=sleep,
            checks=[checks.pydantic_model(Summary)], repair=repair,
        )
    )
    assert result.value == GOOD and [s.repair_ordinal for s in steps] == [0, 1]
    assert result.chain is not None
    assert retryledger.verify_repair_chain(result.chain)["repairs"] == 1


def test_the_decorator_takes_checks_and_repair() -> None:
    clock = FakeClock()
    answers = iter([MISSING, GOOD])
    receipts: List[Dict[str, Any]] = []

    @retryledger.retry(
        repaired_policy(), idempotency_key=KEY, clock=clock, sleep=clock.sleep,
        checks=[checks.pydantic_model(Summary)], repair=fix, on_terminal=receipts.append,
    )
    def summarize(step: retryledger.Step) -> str:
        return next(answers)

    result = summarize.run()
    assert result.value == GOOD and result.chain is not None
    assert [link["bundle"]["receipt"] for link in result.chain["links"]] == receipts
    assert retryledger.verify_repair_chain(result.chain)["kind"] == "verified"
