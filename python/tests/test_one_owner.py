"""One retry owner on every path that is given or can see the client: an
openai client left at its default retries, physical requests counted on a
loopback server. The decorator given the client and the openai integration
refuse it before any request; the decorator without it cannot tell, and the
server sees the SDK's own retries under one recorded attempt (why the
client must be given)."""

from __future__ import annotations

from typing import Any, Dict

import openai
import pytest

import retryledger
import retryledger.openai
from test_openai import FakeProvider

SPEC: Dict[str, Any] = {
    "schema": "retryledger.policy_spec.v1",
    "preset": "interactive",
    "routes": [{"route_id": "primary", "provider": "openai", "model": "gpt-4.1-mini",
                "base_url": "http://127.0.0.1:9/primary/v1", "price": {"input": 400_000, "output": 1_600_000}}],
}
TEMPLATE = retryledger.compile_policy_template(SPEC)
REQUEST = {"schema": "retryledger.request.v1", "operation": "chat", "input": ["hi"]}


@pytest.fixture
def provider() -> Any:
    p = FakeProvider({"primary": [(429, {"retry-after-ms": "1"})]})
    p.thread.start()
    yield p
    p.server.shutdown()
    p.server.server_close()


def client_at_default_retries(provider: FakeProvider) -> openai.OpenAI:
    return openai.OpenAI(base_url=provider.url("primary"), api_key="sk-test")


def call(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(model="gpt-4.1-mini", messages=[{"role": "user", "content": "hi"}])


def test_decorator_given_the_client_refuses_it_at_decoration(provider: FakeProvider) -> None:
    client = client_at_default_retries(provider)
    with pytest.raises(retryledger.PolicyError) as e:

        @retryledger.retry(TEMPLATE, idempotency_key="k", request=REQUEST, clients=[client])
        def summarize(step: retryledger.Step) -> Any:
            return call(client)

    assert e.value.code == "retry_owner_not_harness"
    assert provider.requests == []


def test_decorator_refuses_a_client_whose_retries_are_turned_on_later(provider: FakeProvider) -> None:
    client = openai.OpenAI(base_url=provider.url("primary"), api_key="sk-test", max_retries=0)
    clients = {"primary": client}

    @retryledger.retry(TEMPLATE, idempotency_key="k", request=REQUEST, clients=clients)
    def summarize(step: retryledger.Step) -> Any:
        return call(clients["primary"])

    clients["primary"] = client.with_options(max_retries=3)
    with pytest.raises(retryledger.PolicyError) as e:
        summarize()
    assert e.value.code == "retry_owner_not_harness"
    assert provider.requests == []


def test_an_unreadable_client_is_refused() -> None:
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.retry(TEMPLATE, idempotency_key="k", request=REQUEST, clients=object())
    assert e.value.code == "retry_owner_not_harness"


def test_the_openai_integration_refuses_it_before_any_request(provider: FakeProvider) -> None:
    policy = TEMPLATE.bind(REQUEST, retryledger.idempotency_key_sha256("k"))
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.openai.run(policy, {"primary": client_at_default_retries(provider)}, lambda c, step: call(c), "k")
    assert e.value.code == "retry_owner_not_harness"
    assert provider.requests == []


def test_decorator_without_the_client_cannot_see_its_retries(provider: FakeProvider) -> None:
    client = client_at_default_retries(provider)
    now = [0.0]

    def sleep(ms: float) -> None:
        now[0] += ms

    @retryledger.retry(TEMPLATE, idempotency_key="k", request=REQUEST, clock=lambda: now[0], sleep=sleep)
    def summarize(step: retryledger.Step) -> Any:
        return call(client)

    with pytest.raises(retryledger.RunStoppedError) as e:
        summarize()
    attempts = e.value.bundle["attempts"]["attempts"]
    # each recorded attempt hid the SDK's own retries: 3 requests per attempt
    assert len(provider.requests) == 3 * len(attempts)
