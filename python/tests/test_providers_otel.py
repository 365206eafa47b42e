"""Spans of a cross-provider run carry ``gen_ai.request.model`` and
``gen_ai.response.model`` as the attempts recorded them: each attempt's
requested model, the served model only where the provider's answer named
one."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retryledger import providers
from retryledger.otel import RunTelemetry, spans_of
from retryledger.testing import FakeClock

from provider_loopback import ProviderServer
from test_providers import GEMINI_OK, KEY, OVERLOADED, QUOTA, REQUEST, clients, spec


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ProviderServer] = []

    def start(scripts: Dict[str, List[Dict[str, Any]]]) -> ProviderServer:
        servers.append(ProviderServer(scripts).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_spans_name_the_requested_and_served_model(serve: Any) -> None:
    server = serve({"openai": [OVERLOADED], "anthropic": [QUOTA], "google": [GEMINI_OK]})
    clock = FakeClock()
    result = providers.run(
        REQUEST, spec(["openai", "anthropic", "google"], attempts={"openai": 1}), clients(server), KEY,
        clock=clock, sleep=clock.sleep,
    )
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    # The configured models are not what the attempts recorded: the records win.
    routes = {r: {"provider": r, "model": "configured-elsewhere"} for r in ("openai", "anthropic", "google")}
    written = RunTelemetry(tracing.get_tracer("test"), operation="chat", routes=routes).record(result, 1_780_000_000_000)
    assert written == spans_of(result.bundle, result.receipt_sha256, operation="chat", routes=routes)
    attrs = {
        s.attributes["retryledger.ordinal"]: (s.name, dict(s.attributes))
        for s in exporter.get_finished_spans()
        if s.attributes and "retryledger.ordinal" in s.attributes
    }
    assert [(attrs[o][1].get("gen_ai.request.model"), attrs[o][1].get("gen_ai.response.model")) for o in (1, 2, 3)] == [
        ("gpt-4.1", None),
        ("claude-sonnet-4-5", None),
        ("gemini-2.5-pro", "gemini-2.5-pro-preview-06-05"),
    ]
    assert [attrs[o][0] for o in (1, 2, 3)] == ["chat gpt-4.1", "chat claude-sonnet-4-5", "chat gemini-2.5-pro"]
    [run_span] = [s for s in exporter.get_finished_spans() if s.attributes and "retryledger.terminal" in s.attributes]
    assert run_span.attributes is not None
    assert run_span.attributes["gen_ai.request.model"] == "gemini-2.5-pro"
    assert run_span.attributes["gen_ai.response.model"] == "gemini-2.5-pro-preview-06-05"
    assert run_span.attributes["gen_ai.provider.name"] == "google"
