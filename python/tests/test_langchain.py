"""retryledger.langchain with the real LangChain packages (langchain-core,
langchain-openai, langchain-anthropic, langgraph) driving the real openai and
anthropic SDKs against streaming loopback providers on 127.0.0.1.

Every test makes one framework call (one logical request: one run, one
receipt) and compares the physical requests the loopback server counted with
the receipt's attempts."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Dict, Iterator, List, Sequence

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

import retryledger
from retryledger import checks
from retryledger.langchain import METADATA_KEY, RetryledgerChatModel, text_checks

from framework_support import ANTHROPIC_ROUTE, OPENAI_ROUTE, routes_of, spec
from sse_loopback import SSEServer


def chat_openai(server: SSEServer, route: str, **kwargs: Any) -> ChatOpenAI:
    options: Dict[str, Any] = {"max_retries": 0, **kwargs}
    return ChatOpenAI(model="gpt-fake", api_key="test", base_url=server.url(route), **options)  # type: ignore[arg-type]


def chat_anthropic(server: SSEServer, route: str, **kwargs: Any) -> ChatAnthropic:
    options: Dict[str, Any] = {"max_retries": 0, **kwargs}
    return ChatAnthropic(model="claude-fake", api_key="test", base_url=server.url(route), **options)  # type: ignore[call-arg,arg-type]


STREAM = {"mode": "restart", "max_response_bytes": 65536}


def model(server: SSEServer, **kwargs: Any) -> RetryledgerChatModel:
    return RetryledgerChatModel(
        kwargs.pop("policy_spec", spec()),
        {OPENAI_ROUTE: chat_openai(server, "oa"), ANTHROPIC_ROUTE: chat_anthropic(server, "an")},
        **kwargs,
    )


def run_of(message: BaseMessage) -> Dict[str, Any]:
    meta: Dict[str, Any] = message.response_metadata[METADATA_KEY]
    return meta


def receipt_attempts(meta: Dict[str, Any]) -> int:
    count: int = meta["receipt"]["attempt_count"]
    return count


def verified(meta: Dict[str, Any]) -> None:
    assert retryledger.verify_bundle(meta["bundle_json"])["kind"] == "verified"
    assert retryledger.digest(meta["receipt"]) == meta["receipt_sha256"]


@pytest.fixture
def server() -> Iterator[SSEServer]:
    with SSEServer({}) as s:
        yield s


def test_a_429_then_success_is_one_run_whose_attempts_the_server_counted(server: SSEServer) -> None:
    server.scripts.update(
        oa=[{"status": 429, "headers": {"retry-after-ms": "30"}}, {"text": "severity high"}],
        an=[{"text": "never asked"}],
    )
    answer = model(server).invoke("Summarize INC-4471", idempotency_key="call-1")
    assert isinstance(answer, AIMessage) and answer.text == "severity high"
    meta = run_of(answer)
    assert meta["terminal"] == "completed"
    assert routes_of(server) == ["oa", "oa"]
    assert receipt_attempts(meta) == server.count() == 2
    outcomes = [s["outcome"] for s in meta["receipt"]["schedule"]]
    assert outcomes == ["rate_limited", "success"]
    assert meta["receipt"]["schedule"][1]["not_before_ms"] >= 30
    with server.lock:
        assert {r.idempotency_key for r in server.requests} == {"call-1"}
    # Each attempt records the digest of the body the route's model sent: the same on a retry.
    bundle = json.loads(meta["bundle_json"])
    sent = [a.get("request_body_sha256") for a in bundle["attempts"]["attempts"]]
    assert sent[0] is not None and sent[0] == sent[1]
    # One logical request: the run's request digest is the messages' request.
    request = {
        "schema": "retryledger.request.v1",
        "operation": "langchain.chat",
        "input": [{"type": "human", "data": HumanMessage("Summarize INC-4471").model_dump()}],
    }
    assert meta["receipt"]["logical_request_sha256"] == retryledger.request_sha256(request)
    verified(meta)


def test_a_fallback_from_the_openai_route_to_the_anthropic_route(server: SSEServer) -> None:
    server.scripts.update(oa=[{"status": 503}], an=[{"text": "from claude"}])
    answer = model(server).invoke([HumanMessage("Summarize INC-4471")])
    assert answer.text == "from claude"
    meta = run_of(answer)
    assert routes_of(server) == ["oa", "oa", "an"]
    assert receipt_attempts(meta) == server.count() == 3
    assert meta["receipt"]["fallback_used"] is True
    assert meta["receipt"]["final_route_id"] == ANTHROPIC_ROUTE
    with server.lock:
        keys = {r.idempotency_key for r in server.requests}
    assert len(keys) == 1 and None not in keys
    verified(meta)


def test_async_invoke_retries_under_the_async_driver(server: SSEServer) -> None:
    server.scripts.update(oa=[{"status": 500}, {"text": "async answer"}], an=[{"text": "never"}])
    answer = asyncio.run(model(server).ainvoke("hello"))
    assert answer.text == "async answer"
    meta = run_of(answer)
    assert receipt_attempts(meta) == server.count() == 2
    verified(meta)


def test_a_stream_cut_before_output_is_retried_and_one_answer_streams(server: SSEServer) -> None:
    server.scripts.update(oa=[{"cut_after": 0}, {"text": "one two three four", "chunks": 4}], an=[{"text": "never"}])
    chunks = list(model(server, policy_spec=spec(stream=STREAM)).stream("stream it"))
    text = "".join(c.text for c in chunks)
    assert text == "one two three four"
    last = chunks[-1]
    assert last.chunk_position == "last"
    meta = run_of(last)
    assert meta["terminal"] == "completed"
    assert receipt_attempts(meta) == server.count() == 2
    assert [s["outcome"] for s in meta["receipt"]["schedule"]] == ["unavailable", "success"]
    verified(meta)


def test_an_async_stream_falls_back_after_cuts(server: SSEServer) -> None:
    server.scripts.update(oa=[{"cut_after": 0}], an=[{"text": "claude streams", "chunks": 2}])

    async def consume() -> List[Any]:
        return [c async for c in model(server, policy_spec=spec(stream=STREAM)).astream("stream it")]

    chunks = asyncio.run(consume())
    assert "".join(c.text for c in chunks) == "claude streams"
    meta = run_of(chunks[-1])
    assert routes_of(server) == ["oa", "oa", "an"]
    assert receipt_attempts(meta) == server.count() == 3
    verified(meta)


def test_a_stream_mode_that_takes_output_back_is_refused(server: SSEServer) -> None:
    tentative = spec(stream={**STREAM, "mode": "tentative"})
    with pytest.raises(retryledger.RetryledgerError) as info:
        list(model(server, policy_spec=tentative).stream("x"))
    assert info.value.code == "invalid_stream_contract"
    assert server.count() == 0


def lookup(incident: str) -> str:
    """Look an incident up by its id."""
    return incident


def test_a_tool_call_passes_through_bind_tools_to_the_route(server: SSEServer) -> None:
    server.scripts.update(
        oa=[{"status": 429, "headers": {"retry-after-ms": "10"}},
            {"tool_call": {"name": "lookup", "arguments": {"incident": "INC-4471"}}}],
        an=[{"text": "never"}],
    )
    bound = model(server).bind_tools([lookup])
    answer = bound.invoke("look INC-4471 up")
    assert isinstance(answer, AIMessage)
    assert [(c["name"], c["args"]) for c in answer.tool_calls] == [("lookup", {"incident": "INC-4471"})]
    meta = run_of(answer)
    assert receipt_attempts(meta) == server.count() == 2
    with server.lock:
        sent = [r.body for r in server.requests]
    assert all(b["tools"][0]["function"]["name"] == "lookup" for b in sent)
    # The tools are part of the logical request: the same messages without them are another request.
    plain = model(server).invoke("look INC-4471 up")
    assert run_of(plain)["receipt"]["logical_request_sha256"] != meta["receipt"]["logical_request_sha256"]
    verified(meta)


class Summary(BaseModel):
    title: str
    severity: int


def ask_again(messages: List[BaseMessage], answer: Any, defects: List[Dict[str, Any]]) -> Sequence[BaseMessage]:
    said = "; ".join(f"{d.get('path', '')} {d['message']}" for d in defects)
    return [*messages, answer, HumanMessage(f"Answer again as JSON; fix: {said}")]


def test_structured_output_that_fails_its_schema_once_is_repaired(server: SSEServer) -> None:
    server.scripts.update(
        oa=[{"text": json.dumps({"title": "INC-4471"})},
            {"text": json.dumps({"title": "INC-4471", "severity": 2})}],
        an=[{"text": "never"}],
    )
    repairing = model(
        server,
        policy_spec=spec(repair={"max_repairs": 1, "cost_share_percent": 50}),
        options={"checks": text_checks([checks.pydantic_model(Summary)])},
        repair=ask_again,
    )
    answer = repairing.invoke("Summarize INC-4471 as JSON")
    assert Summary.model_validate_json(answer.text) == Summary(title="INC-4471", severity=2)
    meta = run_of(answer)
    chain = meta["chain"]
    assert len(chain["links"]) == 2
    attempts = sum(link["bundle"]["receipt"]["attempt_count"] for link in chain["links"])
    assert attempts == server.count() == 2
    first = chain["links"][0]["bundle"]["attempts"]["attempts"][0]["outcome"]
    assert first["kind"] == "invalid_output"
    assert retryledger.verify_repair_chain(chain)["kind"] == "verified"
    # The repair sent the defects back with the refused answer.
    with server.lock:
        second = server.requests[1].body["messages"]
    assert "severity" in second[-1]["content"] and len(second) == 3


def test_a_route_model_that_retries_is_refused_before_any_request(server: SSEServer) -> None:
    routes: Dict[str, Any] = {
        OPENAI_ROUTE: ChatOpenAI(model="gpt-fake", api_key="test", base_url=server.url("oa")),  # type: ignore[arg-type]
        ANTHROPIC_ROUTE: chat_anthropic(server, "an"),
    }
    with pytest.raises(retryledger.PolicyError) as info:
        RetryledgerChatModel(spec(), routes)
    assert info.value.code == "retry_owner_not_harness"
    routes[OPENAI_ROUTE] = chat_openai(server, "oa")
    routes[ANTHROPIC_ROUTE] = ChatAnthropic(model="claude-fake", api_key="test", base_url=server.url("an"))  # type: ignore[call-arg,arg-type]
    with pytest.raises(retryledger.PolicyError) as info:
        RetryledgerChatModel(spec(), routes)
    assert info.value.code == "retry_owner_not_harness"
    assert server.count() == 0


def test_with_retry_and_with_fallbacks_are_refused(server: SSEServer) -> None:
    wrapper = model(server)
    stacks: List[Callable[[], Any]] = [wrapper.with_retry, lambda: wrapper.with_fallbacks([chat_openai(server, "oa")])]
    for stack in stacks:
        with pytest.raises(retryledger.PolicyError) as info:
            stack()
        assert info.value.code == "retry_owner_not_harness"
    for wrapped in (chat_openai(server, "oa").with_retry(), chat_openai(server, "oa").with_fallbacks([chat_openai(server, "an")])):
        with pytest.raises(retryledger.PolicyError) as info:
            RetryledgerChatModel(spec(), {OPENAI_ROUTE: wrapped, ANTHROPIC_ROUTE: chat_anthropic(server, "an")})
        assert info.value.code == "retry_owner_not_harness"
    assert server.count() == 0


def test_bad_input_is_a_coded_error(server: SSEServer) -> None:
    with pytest.raises(retryledger.PolicyError) as info:
        RetryledgerChatModel(spec(), {OPENAI_ROUTE: chat_openai(server, "oa")})
    assert info.value.code == "route_model_missing"
    with pytest.raises(retryledger.PolicyError) as info:
        RetryledgerChatModel({"schema": "retryledger.policy.v1"}, {})
    assert info.value.code == "policy_spec_expected"
    with pytest.raises(retryledger.PolicyError) as info:
        model(server, options={"retries": 3})
    assert info.value.code == "unknown_option"
    assert server.count() == 0


def test_a_langgraph_retry_policy_does_not_retry_a_stopped_run(server: SSEServer) -> None:
    from typing_extensions import TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import RetryPolicy

    server.scripts.update(oa=[{"status": 503}], an=[{"status": 529}])
    chat = model(server)

    class State(TypedDict):
        question: str
        answer: str

    def ask(state: State) -> Dict[str, str]:
        return {"answer": chat.invoke(state["question"]).text}

    graph = StateGraph(State)
    graph.add_node("ask", ask, retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01))
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    with pytest.raises(retryledger.RunStoppedError) as info:
        graph.compile().invoke({"question": "x", "answer": ""})
    # The node ran once: LangGraph's default retry_on leaves a ValueError (every
    # retryledger error) alone, so the server saw one run's attempts, not three runs'.
    assert info.value.receipt["attempt_count"] == server.count() == 4
    assert info.value.terminal == "stop_total_attempts"


def test_a_stream_cut_after_output_stops_under_restart(server: SSEServer) -> None:
    server.scripts.update(oa=[{"cut_after": 2, "text": "one two three four", "chunks": 4}, {"text": "never"}],
                          an=[{"text": "never"}])
    seen: List[str] = []
    with pytest.raises(retryledger.RunStoppedError) as info:
        for chunk in model(server, policy_spec=spec(stream=STREAM)).stream("stream it"):
            seen.append(chunk.text)
    assert "".join(seen) == "one two"  # what was shown stays the only output; nothing is joined to it
    assert info.value.terminal == "stop_indeterminate"
    assert info.value.receipt["attempt_count"] == server.count() == 1


def test_a_stream_cut_after_output_is_retried_under_buffer(server: SSEServer) -> None:
    server.scripts.update(oa=[{"cut_after": 2, "text": "lost lost lost lost", "chunks": 4},
                              {"text": "kept answer", "chunks": 2}],
                          an=[{"text": "never"}])
    buffered = spec(stream={**STREAM, "mode": "buffer"})
    chunks = list(model(server, policy_spec=buffered).stream("stream it"))
    assert "".join(c.text for c in chunks) == "kept answer"
    meta = run_of(chunks[-1])
    assert meta["receipt"]["attempt_count"] == server.count() == 2
    verified(meta)


def test_the_telemetry_option_records_each_run(server: SSEServer) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retryledger.otel import RunTelemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = RunTelemetry(provider.get_tracer("test"), MeterProvider().get_meter("test"), operation="chat")
    server.scripts.update(oa=[{"status": 429, "headers": {"retry-after-ms": "5"}}, {"text": "ok"}], an=[{"status": 500}])
    answer = model(server, options={"telemetry": telemetry}).invoke("x")
    spans = exporter.get_finished_spans()
    assert len(spans) == 1 + run_of(answer)["receipt"]["attempt_count"] == 1 + server.count()


def test_with_structured_output_goes_through_bind_tools(server: SSEServer) -> None:
    server.scripts.update(
        oa=[{"status": 503}],
        an=[{"tool_call": {"name": "Summary", "arguments": {"title": "INC-4471", "severity": 3}}}],
    )
    structured = model(server).with_structured_output(Summary, include_raw=True)
    out = structured.invoke("Summarize INC-4471")
    assert isinstance(out, dict)
    assert out["parsed"] == Summary(title="INC-4471", severity=3)
    meta = run_of(out["raw"])
    assert routes_of(server) == ["oa", "oa", "an"]
    assert meta["receipt"]["attempt_count"] == server.count() == 3
    with server.lock:
        anthropic_body = server.requests[2].body
    assert anthropic_body["tools"][0]["name"] == "Summary"


def test_an_earlier_answers_receipt_is_not_part_of_the_next_request(server: SSEServer) -> None:
    server.scripts.update(oa=[{"text": "first"}], an=[{"text": "never"}])
    chat = model(server)
    first = chat.invoke("one")
    history: List[BaseMessage] = [HumanMessage("one"), first, HumanMessage("two")]
    document = chat._call(history, None, "k").request
    assert json.dumps(run_of(first)["receipt"]) not in json.dumps(document)
    assert document["input"][1]["data"]["content"] == "first"
