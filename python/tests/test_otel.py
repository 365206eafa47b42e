"""OpenTelemetry from sealed runs: the run span and one child span per attempt
with the semantic-convention and ``retryledger.*`` attributes, and the
counters and histograms, written to the SDK's in-memory exporters."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import retryledger
from retryledger import AttemptError, Step
from retryledger.otel import RunTelemetry, spans_of

from conftest import KEY, FakeClock, make_policy

ROUTES = {
    "private-primary": {"provider": "private", "model": "summarizer-7b"},
    "external-fallback": {"provider": "openai", "model": "gpt-4.1-mini"},
}


def setup() -> Tuple[InMemorySpanExporter, InMemoryMetricReader, RunTelemetry]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    telemetry = RunTelemetry(provider.get_tracer("test"), meters.get_meter("test"), operation="chat", routes=ROUTES)
    return exporter, reader, telemetry


def reference_run() -> retryledger.RunResult[str]:
    clock = FakeClock()

    def dispatch(step: Step) -> str:
        if step.ordinal == 1:
            clock.advance(1_100)
            raise AttemptError.retryable("rate_limited", retry_after_ms=250)
        if step.ordinal == 2:
            clock.advance(100)
            raise AttemptError.retryable("unavailable")
        clock.advance(750)
        return "summary"

    return retryledger.run(make_policy(), dispatch, KEY, clock=clock, sleep=clock.sleep)


def ms(ns: Any) -> int:
    assert isinstance(ns, int)
    return ns // 1_000_000


def test_the_reference_run_gives_a_run_span_and_three_attempt_spans_with_their_attributes() -> None:
    exporter, _, telemetry = setup()
    run = reference_run()
    t0 = 1_764_000_000_000
    telemetry.record(run, t0)
    spans: Tuple[ReadableSpan, ...] = exporter.get_finished_spans()
    assert len(spans) == 4
    [run_span] = [s for s in spans if s.attributes is not None and "retryledger.terminal" in s.attributes]
    attempts = [s for s in spans if s is not run_span]
    for a in attempts:
        assert a.parent is not None and a.parent.span_id == run_span.context.span_id
    documents = run.bundle["attempts"]["attempts"]
    assert [(ms(a.start_time) - t0, ms(a.end_time) - t0) for a in attempts] == [
        (d["started_at_ms"], d["completed_at_ms"]) for d in documents
    ]
    assert [a.name for a in attempts] == ["chat summarizer-7b", "chat summarizer-7b", "chat gpt-4.1-mini"]
    schedule = run.receipt["schedule"]
    routes = run.bundle["policy"]["routes"]
    assert [dict(a.attributes or {}) for a in attempts] == [
        {
            "retryledger.route_id": "private-primary", "retryledger.ordinal": 1, "retryledger.route_ordinal": 1,
            "retryledger.route_release_sha256": routes[0]["route_release_sha256"],
            "retryledger.outcome.class": "retryable", "retryledger.outcome.kind": "rate_limited", "retryledger.cost": 1500,
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "private", "gen_ai.request.model": "summarizer-7b",
            "retryledger.delay_ms": 0, "retryledger.not_before_ms": 0, "retryledger.retry_after_floor_ms": 0,
            "error.type": "rate_limited",
        },
        {
            "retryledger.route_id": "private-primary", "retryledger.ordinal": 2, "retryledger.route_ordinal": 2,
            "retryledger.route_release_sha256": routes[0]["route_release_sha256"],
            "retryledger.outcome.class": "retryable", "retryledger.outcome.kind": "unavailable", "retryledger.cost": 1500,
            "http.request.resend_count": 1,
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "private", "gen_ai.request.model": "summarizer-7b",
            "retryledger.delay_ms": schedule[1]["delay_ms"], "retryledger.not_before_ms": schedule[1]["not_before_ms"],
            "retryledger.retry_after_floor_ms": 250,
            "error.type": "unavailable",
        },
        {
            "retryledger.route_id": "external-fallback", "retryledger.ordinal": 3, "retryledger.route_ordinal": 1,
            "retryledger.route_release_sha256": routes[1]["route_release_sha256"],
            "retryledger.outcome.class": "success", "retryledger.cost": 3000,
            "http.request.resend_count": 2,
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4.1-mini",
            "retryledger.delay_ms": schedule[2]["delay_ms"], "retryledger.not_before_ms": schedule[2]["not_before_ms"],
            "retryledger.retry_after_floor_ms": schedule[2]["retry_after_floor_ms"],
        },
    ]
    assert [a.status.status_code for a in attempts] == [StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]
    assert dict(run_span.attributes or {}) == {
        "retryledger.terminal": "completed",
        "retryledger.attempt_count": 3,
        "retryledger.fallback_used": True,
        "retryledger.total_cost": run.receipt["total_cost"],
        "retryledger.policy_sha256": run.receipt["policy_sha256"],
        "retryledger.attempts_sha256": run.receipt["attempts_sha256"],
        "retryledger.receipt_sha256": run.receipt_sha256,
        "gen_ai.operation.name": "chat",
        "retryledger.final_route_id": "external-fallback",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4.1-mini",
    }
    assert ms(run_span.end_time) - t0 == run.receipt["finished_at_ms"]


def test_a_stopped_run_marks_errors_and_counts_by_route_outcome_and_terminal() -> None:
    exporter, reader, telemetry = setup()
    clock = FakeClock()

    def dispatch(step: Step) -> str:
        clock.advance(40)
        raise AttemptError.non_retryable("invalid_request")

    with pytest.raises(retryledger.RunStoppedError) as stopped:
        retryledger.run(make_policy(), dispatch, KEY, clock=clock, sleep=clock.sleep)
    telemetry.record(stopped.value)
    attempt, run_span = exporter.get_finished_spans()
    assert attempt.attributes is not None and attempt.attributes["error.type"] == "invalid_request"
    assert "http.request.resend_count" not in attempt.attributes
    assert run_span.attributes is not None and run_span.attributes["error.type"] == "stop_non_retryable"
    assert run_span.status.status_code == StatusCode.ERROR
    data = reader.get_metrics_data()
    assert data is not None
    metrics: Dict[str, Any] = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert sorted(metrics) == [
        "retryledger.attempt.duration", "retryledger.attempts", "retryledger.run.duration", "retryledger.runs",
    ]
    [point] = list(metrics["retryledger.attempts"].data.data_points)
    assert point.value == 1
    assert dict(point.attributes) == {
        "retryledger.route_id": "private-primary", "retryledger.outcome.class": "non_retryable", "error.type": "invalid_request",
    }
    [runs] = list(metrics["retryledger.runs"].data.data_points)
    assert dict(runs.attributes) == {"retryledger.terminal": "stop_non_retryable"}


def test_usage_becomes_gen_ai_usage_tokens_and_the_description_is_a_pure_function() -> None:
    run = reference_run()
    bundle: Dict[str, Any] = run.bundle
    first: Dict[str, Any] = bundle["attempts"]["attempts"][0]
    first["usage"] = {"cached_input": 20, "input": 100, "output": 30, "reasoning": 5}
    spans = spans_of(bundle, run.receipt_sha256, routes=ROUTES)
    assert spans.attempts[0].attributes["gen_ai.usage.input_tokens"] == 120
    assert spans.attempts[0].attributes["gen_ai.usage.output_tokens"] == 35
    assert "gen_ai.usage.input_tokens" not in spans.attempts[1].attributes
    assert spans.run.name == "retryledger.run"
    assert spans_of(bundle, run.receipt_sha256, routes=ROUTES) == spans


def test_record_refuses_what_is_not_a_sealed_run() -> None:
    _, _, telemetry = setup()
    calls: List[Any] = []
    with pytest.raises(TypeError):
        telemetry.record(calls)
