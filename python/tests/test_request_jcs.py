"""An independent RFC 8785 implementation (the ``rfc8785`` package) agrees
with every canonical request and request digest in tests/vectors/request.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import rfc8785

VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "request.json"
CASES = [c for c in json.loads(VECTORS.read_text())["cases"] if c["op"] in ("canonical_request", "request_sha256") and "ok" in c["expect"]]


def as_doubles(v: Any) -> Any:
    """RFC 8785 reads every number as an IEEE 754 double (I-JSON)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return v if abs(v) <= 2**53 - 1 else float(v)
    if isinstance(v, list):
        return [as_doubles(x) for x in v]
    if isinstance(v, dict):
        return {k: as_doubles(x) for k, x in v.items()}
    return v


def test_enough_request_vectors() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_independent_jcs_agrees(case: dict[str, Any]) -> None:
    canonical = rfc8785.dumps(as_doubles(json.loads(case["input"]["request"])))
    want = case["expect"]["ok"]
    if case["op"] == "canonical_request":
        assert canonical.decode("utf-8") == want
    else:
        assert hashlib.sha256(canonical).hexdigest() == want
