"""The Python types and error map against the core's tables (tests/vectors/tables.json)."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, get_args

import retryledger
from retryledger import _tables
from retryledger._errors import EXCEPTION_CLASSES, exception_class, from_error_json

from conftest import ROOT

TABLES: Dict[str, Any] = json.loads((ROOT / "tests" / "vectors" / "tables.json").read_text(encoding="utf-8"))

FAMILY_CLASSES = {
    "decode": retryledger.DecodeError,
    "policy": retryledger.PolicyError,
    "drift": retryledger.DriftError,
    "receipt": retryledger.ReceiptError,
    "http": retryledger.HttpError,
    "run": retryledger.RunError,
    "journal": retryledger.JournalError,
    "idempotency": retryledger.IdempotencyError,
}


def test_generated_module_is_current() -> None:
    sys.path.insert(0, str(ROOT / "python" / "scripts"))
    try:
        import gen_tables  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    assert gen_tables.render(TABLES) == (ROOT / "python" / "retryledger" / "_tables.py").read_text(encoding="utf-8")


def test_every_error_code_maps_to_its_family_class() -> None:
    assert set(TABLES["error_families"]) == set(FAMILY_CLASSES)
    assert TABLES["error_codes"], "no error codes"
    for row in TABLES["error_codes"]:
        cls = exception_class(row["code"])
        assert cls is EXCEPTION_CLASSES[row["code"]] is FAMILY_CLASSES[row["family"]], row
        assert issubclass(cls, retryledger.RetryledgerError)
        text = json.dumps({"code": row["code"], "family": row["family"], "message": "m"})
        assert type(from_error_json(text)) is cls
    assert set(EXCEPTION_CLASSES) == {row["code"] for row in TABLES["error_codes"]}


def test_literal_types_hold_the_tables() -> None:
    assert get_args(_tables.ErrorCode) == tuple(r["code"] for r in TABLES["error_codes"])
    assert get_args(_tables.Terminal) == tuple(TABLES["terminals"]) == _tables.TERMINALS
    assert get_args(_tables.Rule) == tuple(TABLES["rules"]) == _tables.RULES
    assert get_args(_tables.RetryableKind) == tuple(TABLES["outcome_kinds"]["retryable"])
    assert get_args(_tables.NonRetryableKind) == tuple(TABLES["outcome_kinds"]["non_retryable"])
    assert get_args(_tables.IndeterminateKind) == tuple(TABLES["outcome_kinds"]["indeterminate"])
    assert _tables.READ_HEADERS == tuple(TABLES["read_headers"])


def test_every_kind_is_an_outcome_the_core_accepts() -> None:
    for retryable in _tables.RETRYABLE_KINDS:
        assert retryledger.AttemptError.retryable(retryable).outcome == {"class": "retryable", "kind": retryable}
    for rejected in _tables.NON_RETRYABLE_KINDS:
        assert retryledger.AttemptError.non_retryable(rejected).outcome["kind"] == rejected
    for unknown in _tables.INDETERMINATE_KINDS:
        assert retryledger.AttemptError.indeterminate(unknown).outcome["kind"] == unknown


def test_the_classifier_tables_judge_as_listed() -> None:
    """A lone error of each listed class name (or code) is judged by the meaning the table gives."""
    for table, field in ((_tables.OBSERVED_ERROR_TYPES, "error_types"), (_tables.OBSERVED_ERROR_CODES, "error_codes")):
        for name, meaning in table.items():
            judgement = retryledger.judge({"result": "raised", field: [name]})
            if "outcome" in meaning:
                assert judgement == {"outcome": meaning["outcome"], "rule": "error_type"}, name
            else:
                assert judgement["rule"] == "transport", name
