"""Decoding reports every error it finds in one pass: the first stays the
error's own code, path and message; the rest are in ``more_errors``."""

from __future__ import annotations

import json

import pytest

import retryledger

REQUEST = {"schema": "retryledger.request.v1", "operation": "chat", "input": ["Summarize the incident."]}
ROUTE = {"provider": "openai", "model": "gpt-4.1-mini", "base_url": "http://127.0.0.1:8080/v1",
         "price": {"input": 400000, "output": 1600000}}
SPEC = {
    "schema": "retryledger.policy_spec.v1",
    "preset": "fast",
    "retries": 3,
    "idempotency_key_sha256": "a" * 64,
    "routes": [dict(ROUTE, data_boundary="external"),
               {"provider": "openai", "model": "gpt-4.1", "price": {"input": "2000000", "output": 8000000}}],
}


def test_every_spec_mistake_in_one_pass() -> None:
    with pytest.raises(retryledger.DecodeError) as e:
        retryledger.build_policy(REQUEST, SPEC)
    err = e.value
    assert (err.code, err.path) == ("invalid_value", "/preset")
    assert "expected one of `interactive`, `batch`" in err.message
    assert [(m["code"], m["path"]) for m in err.more_errors] == [
        ("unknown_field", "/retries"),
        ("invalid_value", "/routes/0/data_boundary"),
        ("invalid_type", "/routes/1/price/input"),
    ]
    assert "`local_process`, `private_service`, `external_provider`" in err.more_errors[1]["message"]
    assert all(m["family"] == "decode" for m in err.more_errors)


def test_the_list_is_bounded() -> None:
    spec = dict(SPEC, preset="interactive", routes=[ROUTE])
    for i in range(40):
        spec[f"zz{i:02}"] = i
    with pytest.raises(retryledger.DecodeError) as e:
        retryledger.compile_policy_template(json.dumps({k: v for k, v in spec.items() if k != "idempotency_key_sha256"}))
    assert e.value.code == "unknown_field"
    assert len(e.value.more_errors) == 19  # 20 in all


def test_one_error_has_an_empty_list() -> None:
    with pytest.raises(retryledger.DecodeError) as e:
        retryledger.build_policy(REQUEST, dict(SPEC, preset="interactive", routes=[ROUTE]))
    assert (e.value.code, e.value.path, e.value.more_errors) == ("unknown_field", "/retries", [])
