"""The framework adapters compile their spec once and bind each call: the
policy of a call is exactly the one :func:`retryledger.build_policy` gives for
the same spec, request and key (with and without a repair section), and a
spec whose routes carry lowering settings is built per call."""

from __future__ import annotations

import copy
from typing import Any, Dict

import pytest

from framework_support import spec
from retryledger import PolicyTemplate, build_policy, idempotency_key_sha256
from retryledger import PolicyError
from retryledger._frameworks import CallPolicy, template_of

REQUEST: Dict[str, Any] = {
    "schema": "retryledger.request.v1",
    "operation": "langchain.chat",
    "input": [{"type": "human", "data": {"content": "Summarise incident 42."}}],
}


def built(document: Dict[str, Any], request: Dict[str, Any], key: str, scope: Any = None) -> str:
    tenant, operation = scope if scope is not None else (None, None)
    d = {k: v for k, v in document.items() if k != "repair"}
    d["idempotency_key_sha256"] = idempotency_key_sha256(key, tenant=tenant, operation=operation)
    return build_policy(request, d).sha256


@pytest.mark.parametrize("scope", [None, ("tenant-a", "chat")])
def test_a_bound_call_is_the_policy_build_policy_gives(scope: Any) -> None:
    document = spec()
    template = template_of(document)
    assert isinstance(template, PolicyTemplate)
    for n, key in enumerate(["key-1", "key-2"]):
        request = copy.deepcopy(REQUEST)
        request["input"][0]["data"]["content"] += f" ({n})"
        bound = CallPolicy(document, request, key, scope, template)
        assert bound.policy.sha256 == built(document, request, key, scope)
        assert bound.policy.sha256 == CallPolicy(document, request, key, scope).policy.sha256
        assert bound.policy.document["idempotency_key_sha256"] == idempotency_key_sha256(
            key, tenant=scope[0] if scope else None, operation=scope[1] if scope else None
        )


def test_each_call_binds_its_own_request() -> None:
    document = spec()
    template = template_of(document)
    other = copy.deepcopy(REQUEST)
    other["input"][0]["data"]["content"] = "Another question."
    first = CallPolicy(document, REQUEST, "k", None, template).policy
    second = CallPolicy(document, other, "k", None, template).policy
    assert first.document["logical_request_sha256"] != second.document["logical_request_sha256"]


def test_a_repair_section_is_kept_after_binding() -> None:
    repair = {"cost_share_percent": 50, "max_repairs": 2}
    document = spec(repair=repair)
    template = template_of(document)
    assert template is not None
    bound = CallPolicy(document, REQUEST, "k", None, template).policy
    per_call = CallPolicy(document, REQUEST, "k", None).policy
    assert bound.document.get("repair") == per_call.document.get("repair")
    assert bound.sha256 == per_call.sha256


def test_a_spec_with_lowering_settings_is_built_per_call() -> None:
    document = spec()
    document["routes"][0]["release"]["lowering"] = {
        "api": "openai.chat_completions",
        "context_window_tokens": 200000,
        "max_output_tokens": 8192,
    }
    assert template_of(document) is None
    bound = CallPolicy(document, REQUEST, "k", None, None).policy
    assert bound.sha256 == built(document, REQUEST, "k")


def test_a_spec_the_core_refuses_is_refused_with_its_code() -> None:
    document = spec()
    document["max_total_attempts"] = 0
    with pytest.raises(PolicyError) as refused:
        template_of(document)
    assert refused.value.code != ""
    assert refused.value.path == "/max_total_attempts"
