"""One retry owner on the anthropic, httpx and google-genai paths: a client
whose own retries are on (the anthropic SDK at its default ``max_retries=2``,
an httpx transport with retries, a google-genai client with retry options)
is refused by the integration and by the decorator given it, before any
request: the loopback server counts none. The same paths with the retries
off send, so the count is not empty for want of a request."""

from __future__ import annotations

from typing import Any, Dict

import anthropic
import httpx
import pytest
from google import genai
from google.genai import types as genai_types

import retryledger
import retryledger.anthropic
import retryledger.google_genai
import retryledger.httpx
from test_openai import FakeProvider

SPEC: Dict[str, Any] = {
    "schema": "retryledger.policy_spec.v1",
    "preset": "interactive",
    "routes": [{"route_id": "primary", "provider": "openai", "model": "gpt-4.1-mini",
                "base_url": "http://127.0.0.1:9/primary/v1", "price": {"input": 400_000, "output": 1_600_000}}],
}
TEMPLATE = retryledger.compile_policy_template(SPEC)
REQUEST = {"schema": "retryledger.request.v1", "operation": "chat", "input": ["hi"]}
POLICY = TEMPLATE.bind(REQUEST, retryledger.idempotency_key_sha256("k"))


@pytest.fixture
def provider() -> Any:
    p = FakeProvider({"primary": [(200, {})]})
    p.thread.start()
    yield p
    p.server.shutdown()
    p.server.server_close()


def refused(e: pytest.ExceptionInfo[retryledger.PolicyError]) -> bool:
    return e.value.code == "retry_owner_not_harness"


def ask_anthropic(client: anthropic.Anthropic) -> Any:
    return client.messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}])


def test_anthropic_at_its_default_retries(provider: FakeProvider) -> None:
    client = anthropic.Anthropic(base_url=provider.url("primary"), api_key="sk-test")
    assert client.max_retries == 2  # the SDK's default
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.anthropic.run(POLICY, {"primary": client}, lambda c, step: ask_anthropic(c), "k")
    assert refused(e)
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.retry(TEMPLATE, idempotency_key="k", request=REQUEST, clients=[client])
    assert refused(e)
    assert provider.requests == []


def test_httpx_with_transport_retries(provider: FakeProvider) -> None:
    client = httpx.Client(transport=httpx.HTTPTransport(retries=3))
    url = provider.url("primary") + "/chat/completions"
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.httpx.run(POLICY, {"primary": client}, lambda c, step: c.post(url, json={}), "k")
    assert refused(e)
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.retry(TEMPLATE, idempotency_key="k", request=REQUEST, clients=client)
    assert refused(e)
    assert provider.requests == []
    # The default transport does not retry: the same call is sent, once.
    plain = httpx.Client()
    result = retryledger.httpx.run(POLICY, {"primary": plain}, lambda c, step: c.post(url, json={}), "k")
    assert result.receipt["terminal"] == "completed"
    assert len(provider.requests) == 1


def genai_client(provider: FakeProvider, retry: Any = None) -> genai.Client:
    return genai.Client(api_key="t", http_options=genai_types.HttpOptions(
        base_url=provider.url("primary"), api_version="v1beta", retry_options=retry))


def test_google_genai_with_retry_options(provider: FakeProvider) -> None:
    client = genai_client(provider, genai_types.HttpRetryOptions())  # attempts unset: the SDK's 5
    call = lambda c, options, step: c.models.generate_content(  # noqa: E731
        model="gemini-x", contents="hi", config=genai_types.GenerateContentConfig(http_options=options))
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.google_genai.run(POLICY, {"primary": client}, call, "k")
    assert refused(e)
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.retry(TEMPLATE, idempotency_key="k", request=REQUEST, clients={"primary": client})
    assert refused(e)
    assert provider.requests == []
