"""A call that sends another request than the one its policy binds is
refused before it is sent (``request_drift``): the openai and anthropic
integrations and the decorator given its clients lift each SDK call's body
and the core compares it with the request the template bound. Physical
requests are counted on a loopback server."""

from __future__ import annotations

from typing import Any, Dict

import anthropic
import openai
import pytest

import retryledger
import retryledger.anthropic
import retryledger.openai
from test_openai import FakeProvider

SPEC: Dict[str, Any] = {
    "schema": "retryledger.policy_spec.v1",
    "preset": "interactive",
    "routes": [{"route_id": "primary", "provider": "openai", "model": "gpt-4.1-mini",
                "base_url": "http://127.0.0.1:9/primary/v1", "price": {"input": 400_000, "output": 1_600_000}}],
}
TEMPLATE = retryledger.compile_policy_template(SPEC)
BOUND: Any = [{"role": "user", "content": "Summarize the incident."}]
OTHER: Any = [{"role": "user", "content": "Write a poem instead."}]
CHAT = retryledger.lift_request("openai.chat.completions", {"model": "gpt-4.1-mini", "messages": BOUND})


@pytest.fixture
def provider() -> Any:
    p = FakeProvider({"primary": [(200, {})]})
    p.thread.start()
    yield p
    p.server.shutdown()
    p.server.server_close()


def client(provider: FakeProvider) -> openai.OpenAI:
    return openai.OpenAI(base_url=provider.url("primary"), api_key="sk-test", max_retries=0)


def chat(messages: Any) -> Any:
    return lambda c, step: c.chat.completions.create(model="gpt-4.1-mini", messages=messages)


def test_the_integration_refuses_another_prompt_before_sending(provider: FakeProvider) -> None:
    policy = TEMPLATE.bind(CHAT, retryledger.idempotency_key_sha256("k"))
    with pytest.raises(retryledger.DriftError) as e:
        retryledger.openai.run(policy, {"primary": client(provider)}, chat(OTHER), "k")
    assert (e.value.code, e.value.path) == ("request_drift", "/input")
    assert retryledger.request_sha256(CHAT) in e.value.message
    assert provider.requests == []


def test_the_bound_prompt_is_sent_under_any_model_and_stream_options(provider: FakeProvider) -> None:
    policy = TEMPLATE.bind(CHAT, retryledger.idempotency_key_sha256("k"))
    result = retryledger.openai.run(policy, {"primary": client(provider)}, chat(BOUND), "k")
    assert result.receipt["terminal"] == "completed"
    assert len(provider.requests) == 1


def test_an_unknown_parameter_cannot_be_checked_and_is_refused(provider: FakeProvider) -> None:
    policy = TEMPLATE.bind(CHAT, retryledger.idempotency_key_sha256("k"))
    call = lambda c, step: c.chat.completions.create(  # noqa: E731
        model="gpt-4.1-mini", messages=BOUND, extra_body={"frobnicate": 1})
    with pytest.raises(retryledger.DriftError) as e:
        retryledger.openai.run(policy, {"primary": client(provider)}, call, "k")
    assert (e.value.code, e.value.path) == ("request_drift", "/frobnicate")
    assert provider.requests == []


def test_a_stream_with_another_prompt_is_refused(provider: FakeProvider) -> None:
    spec = dict(SPEC, stream={"mode": "buffer", "max_response_bytes": 1 << 20})
    template = retryledger.compile_policy_template(spec)
    policy = template.bind(CHAT, retryledger.idempotency_key_sha256("k"))
    with pytest.raises(retryledger.DriftError) as e:
        for _ in retryledger.openai.stream_chat_completions(
            policy, {"primary": client(provider)}, {"model": "gpt-4.1-mini", "messages": OTHER}, "k"
        ):
            pass
    assert e.value.code == "request_drift"
    assert provider.requests == []


def test_the_anthropic_integration_refuses_another_prompt(provider: FakeProvider) -> None:
    bound = retryledger.lift_request(
        "anthropic.messages", {"model": "claude-x", "max_tokens": 64, "messages": BOUND})
    policy = TEMPLATE.bind(bound, retryledger.idempotency_key_sha256("k"))
    c = anthropic.Anthropic(base_url=provider.url("primary"), api_key="sk-test", max_retries=0)
    with pytest.raises(retryledger.DriftError) as e:
        retryledger.anthropic.run(
            policy, {"primary": c},
            lambda c, step: c.messages.create(model="claude-x", max_tokens=64, messages=OTHER), "k")
    assert (e.value.code, e.value.path) == ("request_drift", "/input")
    assert provider.requests == []


def test_the_decorator_given_its_client_refuses_another_prompt(provider: FakeProvider) -> None:
    c = client(provider)

    @retryledger.retry(TEMPLATE, idempotency_key="k", request=lambda prompt: CHAT, clients=[c])
    def summarize(step: retryledger.Step, prompt: str) -> Any:
        return c.chat.completions.create(model="gpt-4.1-mini", messages=[{"role": "user", "content": prompt}])

    with pytest.raises(retryledger.DriftError) as e:
        summarize("Write a poem instead.")
    assert e.value.code == "request_drift"
    assert provider.requests == []
    summarize("Summarize the incident.")
    assert len(provider.requests) == 1
    assert provider.requests[0].idempotency_key == "k"


def test_a_request_written_by_hand_is_not_compared(provider: FakeProvider) -> None:
    by_hand = {"schema": "retryledger.request.v1", "operation": "chat", "input": ["hi"]}
    policy = TEMPLATE.bind(by_hand, retryledger.idempotency_key_sha256("k"))
    result = retryledger.openai.run(policy, {"primary": client(provider)}, chat(OTHER), "k")
    assert result.receipt["terminal"] == "completed"
    assert len(provider.requests) == 1
