"""The JSON-text API: plain values back, typed errors by family, no input crashes."""

from __future__ import annotations

import json
import random
from typing import Any, Callable, List

import pytest

import retryledger
from retryledger import _core

from conftest import make_policy, reference_bundle


def test_policy_is_compiled_once_and_reused() -> None:
    bundle = reference_bundle()
    policy = retryledger.Policy(bundle["policy"])
    assert policy.sha256 == retryledger.validate_policy(bundle["policy"])
    assert policy.sha256 == retryledger.digest(json.dumps(bundle["policy"]))
    assert policy.sha256 == bundle["receipt"]["policy_sha256"]
    assert policy.document == bundle["policy"]
    assert policy.evaluate(bundle["attempts"]) == bundle["receipt"]
    assert retryledger.evaluate(policy, bundle["attempts"]) == bundle["receipt"]
    assert policy.seal(bundle["attempts"]) == bundle
    decision = policy.plan_next({"schema": "retryledger.attempts.v1", "attempts": []})
    assert decision["kind"] == "dispatch" and decision["not_before_ms"] == 0
    assert retryledger.plan_next(bundle["policy"], bundle["attempts"]) == {"kind": "terminal", "terminal": "completed"}
    assert repr(policy) == f"Policy(sha256={policy.sha256!r})"


def test_documents_as_dict_text_or_bytes_agree() -> None:
    policy = make_policy()
    text = json.dumps(policy, indent=2)
    assert retryledger.validate_policy(policy) == retryledger.validate_policy(text)
    assert retryledger.validate_policy(text.encode()) == retryledger.validate_policy(text)


@pytest.mark.parametrize(
    ("edit", "cls", "code", "path"),
    [
        ({"retry_owner": "transport_sdk"}, retryledger.PolicyError, "retry_owner_not_harness", "/retry_owner"),
        ({"max_total_attempts": 0}, retryledger.PolicyError, "budget_unbounded", "/max_total_attempts"),
        ({"deadline_ms": 1.0}, retryledger.DecodeError, "float_value", "/deadline_ms"),
        ({"deadline_ms": 2**53}, retryledger.DecodeError, "integer_out_of_range", "/deadline_ms"),
        ({"deadline_ms": None}, retryledger.DecodeError, "null_value", "/deadline_ms"),
        ({"surprise": 1}, retryledger.DecodeError, "unknown_field", None),
    ],
)
def test_errors_are_raised_by_family(edit: Any, cls: Any, code: str, path: Any) -> None:
    with pytest.raises(cls) as info:
        retryledger.Policy(make_policy(**edit))
    err = info.value
    assert isinstance(err, retryledger.RetryledgerError) and isinstance(err, ValueError)
    assert err.code == code
    if path is not None:
        assert err.path == path
    assert code in str(err)


def test_drift_and_run_errors() -> None:
    bundle = reference_bundle()
    attempts = bundle["attempts"]
    attempts["attempts"][1]["started_at_ms"] = 1_300
    with pytest.raises(retryledger.DriftError) as drift:
        retryledger.evaluate(bundle["policy"], attempts)
    assert drift.value.code == "early_start"
    assert drift.value.attempt_index == 1
    assert drift.value.path == "/attempts/1/started_at_ms"
    with pytest.raises(retryledger.RunError) as run:
        retryledger.evaluate(bundle["policy"], {"schema": "retryledger.attempts.v1", "attempts": []})
    assert run.value.code == "run_not_terminal"


def test_http_helpers() -> None:
    assert retryledger.parse_retry_after("Retry-After", "2", 0, 60_000) == 2_000
    assert retryledger.parse_retry_after("retry-after-ms", "250.5", 0, 60_000) == 251
    with pytest.raises(retryledger.HttpError) as info:
        retryledger.parse_retry_after("retry-after", "soon", 0, 60_000)
    assert info.value.code == "retry_after_invalid"
    with pytest.raises(retryledger.DecodeError) as bad:
        retryledger.parse_retry_after("retry-after", "1", -1, 60_000)
    assert (bad.value.code, bad.value.path) == ("integer_out_of_range", "/now_unix_ms")
    with pytest.raises(retryledger.DecodeError):
        retryledger.parse_retry_after("retry-after", "1", 0, 1.5)  # type: ignore[arg-type]
    with pytest.raises(retryledger.DecodeError):
        retryledger.parse_retry_after("retry-after", 1, 0, 5)  # type: ignore[arg-type]
    outcome = retryledger.classify_http({"status": 429, "headers": [["Retry-After", "3"]]})
    assert outcome == {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 3_000}
    with pytest.raises(retryledger.HttpError):
        retryledger.classify_http({"status": 600})


class Unserializable:
    pass


def _deep(n: int) -> Any:
    value: Any = 0
    for _ in range(n):
        value = [value]
    return value


HOSTILE: List[Any] = [
    "",
    "{",
    "null",
    "[]",
    '{"schema":"retryledger.policy.v1","schema":"retryledger.policy.v1"}',
    "\ud800",
    '"\\ud800"',
    "[" * 100_000,
    "9" * 5_000,
    "x" * (3 * 1024 * 1024),
    b"\xff\xfe",
    {"k": Unserializable()},
    {"k": float("nan")},
    {1: 2},
    _deep(50_000),
    42,
    None,
    ["not", "an", "object"],
]

OPERATIONS: List[Callable[[Any], Any]] = [
    retryledger.validate_policy,
    retryledger.digest,
    retryledger.verify_bundle,
    retryledger.classify_http,
    lambda d: retryledger.plan_next(make_policy(), d),
    lambda d: retryledger.evaluate(d, d),
    retryledger.Policy,
]


@pytest.mark.parametrize("document", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_input_raises_a_coded_error(document: Any) -> None:
    for op in OPERATIONS:
        with pytest.raises(retryledger.RetryledgerError) as info:
            op(document)
        assert info.value.code


def test_random_bytes_never_crash() -> None:
    rng = random.Random(5)
    alphabet = '{}[]",:0123456789-.eEtrufalsn \\u"abcxyz\ud800'
    for _ in range(2_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        for op in (retryledger.validate_policy, retryledger.digest, retryledger.verify_bundle):
            try:
                op(text)
            except retryledger.RetryledgerError:
                pass


def test_extension_raises_typed_coded_errors() -> None:
    with pytest.raises(retryledger.DecodeError) as info:
        _core.validate_policy(b"{}")
    assert info.value.code == "invalid_type"
    with pytest.raises(retryledger.DecodeError) as info:
        _core.Outcome(None)
    assert info.value.code == "null_value"
    with pytest.raises(retryledger.DecodeError) as info:
        _core.Compiled('{"schema":"retryledger.policy.v1"}')
    assert info.value.code == "missing_field"


def test_lab() -> None:
    lab = retryledger.lab()
    assert lab.report["passed"] == lab.report["total"] == len(lab.report["cases"])
    assert "mutation cases" in lab.summary
    assert "valid_success" in lab.case_table
