"""retryledger.pydantic_ai with the real Pydantic AI (pydantic-ai-slim, its
openai and anthropic models) driving the real SDKs against streaming loopback
providers on 127.0.0.1.

Every test makes one agent call whose model request is one logical request
(one run, one receipt) and compares the physical requests the loopback
server counted with the receipt's attempts."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, Iterator

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

import retryledger
from retryledger import checks
from retryledger.pydantic_ai import DETAILS_KEY, RetryledgerModel, output_checks, retry_prompt

from framework_support import routes_of, spec
from sse_loopback import SSEServer


def openai_model(server: SSEServer, route: str, retries: int = 0) -> OpenAIChatModel:
    client = AsyncOpenAI(api_key="test", base_url=server.url(route), max_retries=retries)
    return OpenAIChatModel("gpt-fake", provider=OpenAIProvider(openai_client=client))


def anthropic_model(server: SSEServer, route: str, retries: int = 0) -> AnthropicModel:
    client = AsyncAnthropic(api_key="test", base_url=server.url(route), max_retries=retries)
    return AnthropicModel("claude-fake", provider=AnthropicProvider(anthropic_client=client))


def model(server: SSEServer, **kwargs: Any) -> RetryledgerModel:
    return RetryledgerModel(
        openai_model(server, "oa"), anthropic_model(server, "an"), policy=kwargs.pop("policy", spec()), **kwargs
    )


def run_of(response: ModelResponse) -> Dict[str, Any]:
    assert response.provider_details is not None
    meta: Dict[str, Any] = response.provider_details[DETAILS_KEY]
    return meta


def verified(meta: Dict[str, Any]) -> None:
    assert retryledger.verify_bundle(meta["bundle_json"])["kind"] == "verified"
    assert retryledger.digest(meta["receipt"]) == meta["receipt_sha256"]


@pytest.fixture
def server() -> Iterator[SSEServer]:
    with SSEServer({}) as s:
        yield s


def test_it_is_a_fallback_model() -> None:
    assert issubclass(RetryledgerModel, FallbackModel)


def test_a_429_then_success_is_one_run_whose_attempts_the_server_counted(server: SSEServer) -> None:
    server.scripts.update(
        oa=[{"status": 429, "headers": {"retry-after-ms": "30"}}, {"text": "severity high"}],
        an=[{"text": "never asked"}],
    )
    result = Agent(model(server)).run_sync("Summarize INC-4471")
    assert result.output == "severity high"
    meta = run_of(result.response)
    assert meta["terminal"] == "completed"
    assert routes_of(server) == ["oa", "oa"]
    assert meta["receipt"]["attempt_count"] == server.count() == 2
    schedule = meta["receipt"]["schedule"]
    assert [s["outcome"] for s in schedule] == ["rate_limited", "success"]
    # The hint of the SDK's error (which Pydantic AI wraps) was read: no retry before it.
    assert schedule[1]["not_before_ms"] - schedule[0]["completed_at_ms"] >= 30
    with server.lock:
        keys = {r.idempotency_key for r in server.requests}
    assert len(keys) == 1 and None not in keys
    sent = [a.get("request_body_sha256") for a in json.loads(meta["bundle_json"])["attempts"]["attempts"]]
    assert sent[0] is not None and sent[0] == sent[1]
    verified(meta)


def test_a_fallback_from_the_openai_route_to_the_anthropic_route(server: SSEServer) -> None:
    server.scripts.update(oa=[{"status": 503}], an=[{"text": "from claude"}])
    result = asyncio.run(Agent(model(server)).run("Summarize INC-4471"))
    assert result.output == "from claude"
    meta = run_of(result.response)
    assert routes_of(server) == ["oa", "oa", "an"]
    assert meta["receipt"]["attempt_count"] == server.count() == 3
    assert meta["receipt"]["fallback_used"] is True
    verified(meta)


def lookup(incident: str) -> str:
    """Look an incident up by its id."""
    return f"{incident}: database failover"


def test_a_tool_call_then_the_answer_two_logical_requests(server: SSEServer) -> None:
    server.scripts.update(
        oa=[{"status": 500}, {"tool_call": {"name": "lookup", "arguments": {"incident": "INC-4471"}}},
            {"text": "it was the database"}],
        an=[{"text": "never"}],
    )
    agent = Agent(model(server), tools=[lookup])
    result = agent.run_sync("What was INC-4471?")
    assert result.output == "it was the database"
    responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    assert len(responses) == 2  # two model requests: two runs
    counted = sum(run_of(r)["receipt"]["attempt_count"] for r in responses)
    assert counted == server.count() == 3
    with server.lock:
        bodies = [r.body for r in server.requests]
    assert all(b["tools"][0]["function"]["name"] == "lookup" for b in bodies)
    assert bodies[2]["messages"][-1]["role"] == "tool"
    digests = {run_of(r)["receipt"]["logical_request_sha256"] for r in responses}
    assert len(digests) == 2
    # A later request holds the earlier response without the receipt it carries.
    from pydantic_ai.models import ModelRequestParameters

    history = result.all_messages()[:3]
    document = model(server)._request_document(history, ModelRequestParameters())
    assert json.dumps(run_of(responses[0])["receipt"]) not in json.dumps(document)
    assert "tool_name" in json.dumps(document["input"][1])


STREAM = {"mode": "buffer", "max_response_bytes": 65536}


def test_a_stream_cut_before_output_is_retried_and_one_response_streams(server: SSEServer) -> None:
    server.scripts.update(oa=[{"cut_after": 0}, {"text": "one two three", "chunks": 3}], an=[{"text": "never"}])

    async def streamed() -> Any:
        async with Agent(model(server, policy=spec(stream=STREAM))).run_stream("stream it") as run:
            output = await run.get_output()
            return output, run.response

    output, response = asyncio.run(streamed())
    assert output == "one two three"
    meta = run_of(response)
    assert meta["terminal"] == "completed"
    assert meta["receipt"]["attempt_count"] == server.count() == 2
    assert [s["outcome"] for s in meta["receipt"]["schedule"]] == ["unavailable", "success"]
    with server.lock:
        assert all(r.body.get("stream") is True for r in server.requests)
    verified(meta)


def test_a_stream_cut_after_output_falls_back_and_shows_only_the_fallback(server: SSEServer) -> None:
    server.scripts.update(oa=[{"cut_after": 2, "text": "lost lost lost lost", "chunks": 4}],
                          an=[{"text": "from claude", "chunks": 2}])

    async def streamed() -> Any:
        async with Agent(model(server, policy=spec(stream=STREAM))).run_stream("stream it") as run:
            output = await run.get_output()
            return output, run.response

    output, response = asyncio.run(streamed())
    assert output == "from claude"
    meta = run_of(response)
    assert routes_of(server) == ["oa", "oa", "an"]
    assert meta["receipt"]["attempt_count"] == server.count() == 3
    verified(meta)


def test_a_stream_without_a_stream_contract_is_refused_before_any_request(server: SSEServer) -> None:
    server.scripts.update(oa=[{"text": "never"}], an=[{"text": "never"}])

    async def streamed() -> None:
        async with Agent(model(server)).run_stream("stream it") as run:
            await run.get_output()

    with pytest.raises(retryledger.PolicyError) as info:
        asyncio.run(streamed())
    assert info.value.code == "invalid_stream_contract"
    assert server.count() == 0


class Summary(BaseModel):
    title: str
    severity: int


def test_structured_output_that_fails_its_schema_once_is_repaired(server: SSEServer) -> None:
    server.scripts.update(
        oa=[{"tool_call": {"name": "final_result", "arguments": {"title": "INC-4471"}}},
            {"tool_call": {"name": "final_result", "arguments": {"title": "INC-4471", "severity": 2}}}],
        an=[{"text": "never"}],
    )
    repairing = model(
        server,
        policy=spec(repair={"max_repairs": 1, "cost_share_percent": 50}),
        options={"checks": output_checks([checks.pydantic_model(Summary)])},
        repair=retry_prompt,
    )
    result = Agent(repairing, output_type=Summary, retries={"output": 0}).run_sync("Summarize INC-4471")
    assert result.output == Summary(title="INC-4471", severity=2)
    meta = run_of(result.response)
    chain = meta["chain"]
    assert len(chain["links"]) == 2
    attempts = sum(link["bundle"]["receipt"]["attempt_count"] for link in chain["links"])
    assert attempts == server.count() == 2
    assert chain["links"][0]["bundle"]["attempts"]["attempts"][0]["outcome"]["kind"] == "invalid_output"
    assert retryledger.verify_repair_chain(chain)["kind"] == "verified"
    with server.lock:
        repaired = server.requests[1].body["messages"]
    assert repaired[-1]["role"] == "tool" and "severity" in repaired[-1]["content"]


def test_a_model_whose_client_retries_is_refused_before_any_request(server: SSEServer) -> None:
    for default, fallback in (
        (openai_model(server, "oa", retries=2), anthropic_model(server, "an")),
        (openai_model(server, "oa"), anthropic_model(server, "an", retries=2)),
    ):
        with pytest.raises(retryledger.PolicyError) as info:
            RetryledgerModel(default, fallback, policy=spec())
        assert info.value.code == "retry_owner_not_harness"
    # An HTTP client whose transport retries, under an SDK client without retries, retries too.
    import httpx2

    retrying = AsyncAnthropic(
        api_key="test", base_url=server.url("an"), max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(retries=2)),
    )
    with pytest.raises(retryledger.PolicyError) as info:
        RetryledgerModel(
            openai_model(server, "oa"),
            AnthropicModel("claude-fake", provider=AnthropicProvider(anthropic_client=retrying)),
            policy=spec(),
        )
    assert info.value.code == "retry_owner_not_harness" and "transport" in str(info.value)
    with pytest.raises(retryledger.PolicyError) as info:
        RetryledgerModel(openai_model(server, "oa"), anthropic_model(server, "an"), policy=spec(), fallback_on=(Exception,))
    assert info.value.code == "retry_owner_not_harness"
    assert server.count() == 0


def test_bad_input_is_a_coded_error(server: SSEServer) -> None:
    with pytest.raises(retryledger.PolicyError) as info:
        RetryledgerModel(openai_model(server, "oa"), policy=spec())
    assert info.value.code == "route_model_missing"
    with pytest.raises(retryledger.PolicyError) as info:
        RetryledgerModel(openai_model(server, "oa"), anthropic_model(server, "an"), policy=json.dumps({"schema": "x"}))
    assert info.value.code == "policy_spec_expected"
    assert server.count() == 0
