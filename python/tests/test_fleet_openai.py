"""The openai integration passes ``fleet=`` through: against a real loopback
provider whose primary keeps failing, one run opens the shared breaker and
the next sends nothing to the primary."""

from __future__ import annotations

from typing import Any

import openai

import retryledger
import retryledger.openai as rl_openai
from retryledger.stores import MemoryStore

from conftest import KEY
from fleet_support import BREAKER
from test_openai import FakeProvider, ask, openai_policy, provider  # noqa: F401 (the fixture)


def test_openai_run_with_a_fleet_skips_the_open_primary(provider: FakeProvider) -> None:  # noqa: F811
    document: dict[str, Any] = openai_policy()
    document["fleet"] = {"breaker": BREAKER, "on_store_unavailable": "fail_closed"}
    policy = retryledger.Policy(document)
    clients = {
        "private-primary": openai.OpenAI(api_key="test", base_url=provider.url("primary"), max_retries=0),
        "external-fallback": openai.OpenAI(api_key="test", base_url=provider.url("fallback"), max_retries=0),
    }
    fleet = retryledger.Fleet(MemoryStore())
    first = rl_openai.run(policy, clients, ask, KEY, fleet=fleet)
    assert first.value == "severity: high"
    assert [r.route for r in provider.requests] == ["primary", "primary", "fallback"]
    second = rl_openai.run(policy, clients, ask, KEY, fleet=fleet)
    assert second.value == "severity: high"
    assert [r.route for r in provider.requests] == ["primary", "primary", "fallback", "fallback"]
    assert second.receipt["fleet"]["routes_skipped"] == 1
    assert retryledger.verify_bundle(second.bundle_json)["kind"] == "verified"
