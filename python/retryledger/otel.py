"""OpenTelemetry for sealed runs: one span per logical run and one child span
per attempt, with the semantic-convention attributes and ``retryledger.*``,
plus counters and duration histograms, all read from the run's documents
(bundle and receipt), so telemetry can never disagree with the receipt and
never changes a decision.

Needs ``opentelemetry-api`` (``pip install retryledger[otel]``)::

    from opentelemetry import trace, metrics
    from retryledger.otel import RunTelemetry

    telemetry = RunTelemetry(trace.get_tracer("app"), metrics.get_meter("app"), operation="chat",
                             routes={"private-primary": {"provider": "private", "model": "summarizer-7b"}})
    started = time.time_ns() // 1_000_000
    try:
        result = retryledger.run(policy, dispatch, key)
        telemetry.record(result, started)
    except retryledger.RunStoppedError as stopped:
        telemetry.record(stopped, started)
        raise

Attempt spans carry their real start and end (the run clock offset from the
run's wall-clock start); they are written when the run is recorded, so an
HTTP client's own spans are not nested under them. The TypeScript package
describes the same spans (``retryledger/otel``). docs/TELEMETRY.md.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import Meter
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

__all__ = ["RunTelemetry", "SpanDescription", "RunSpans", "spans_of"]

#: Attribute values: what OpenTelemetry takes.
Attributes = Dict[str, Any]


class SpanDescription:
    """One span as :func:`spans_of` describes it."""

    __slots__ = ("name", "start_ms", "end_ms", "attributes", "error")

    def __init__(self, name: str, start_ms: int, end_ms: int, attributes: Attributes, error: Optional[str] = None) -> None:
        #: The span's name.
        self.name = name
        #: Offsets of its start and end from the run's start, ms.
        self.start_ms = start_ms
        self.end_ms = end_ms
        #: Its attributes.
        self.attributes = attributes
        #: The error's type when the span failed (its status is then ERROR).
        self.error = error

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpanDescription) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self) -> str:
        return f"SpanDescription({self.name!r}, {self.start_ms}..{self.end_ms}, error={self.error!r})"


class RunSpans:
    """The run's span and its attempts' spans."""

    __slots__ = ("run", "attempts")

    def __init__(self, run: SpanDescription, attempts: List[SpanDescription]) -> None:
        self.run = run
        self.attempts = attempts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunSpans) and self.run == other.run and self.attempts == other.attempts


def _usage_tokens(usage: Optional[Mapping[str, int]]) -> Attributes:
    if usage is None:
        return {}
    out: Attributes = {}
    if "input" in usage or "cached_input" in usage:
        out["gen_ai.usage.input_tokens"] = usage.get("input", 0) + usage.get("cached_input", 0)
    if "output" in usage or "reasoning" in usage:
        out["gen_ai.usage.output_tokens"] = usage.get("output", 0) + usage.get("reasoning", 0)
    return out


def _models(attempt: Mapping[str, Any], route: Mapping[str, str]) -> "tuple[Optional[str], Optional[str]]":
    """The attempt's requested and served model: what it recorded (``model``:
    ``requested``, ``served``), the requested one else the route's configured
    ``model``; a served model it did not record is unknown (``None``)."""
    recorded = attempt.get("model") or {}
    requested = recorded.get("requested", route.get("model"))
    return requested, recorded.get("served")


def _span_name(operation: Optional[str], model: Optional[str], fallback: str) -> str:
    if operation is not None and model is not None:
        return f"{operation} {model}"
    return operation if operation is not None else fallback


def spans_of(
    bundle: Mapping[str, Any],
    receipt_sha256: str,
    *,
    operation: Optional[str] = None,
    routes: Optional[Mapping[str, Mapping[str, str]]] = None,
) -> RunSpans:
    """The spans of a sealed run, described from its bundle and receipt digest
    (what :meth:`RunTelemetry.record` writes; the same description the
    TypeScript package's ``spansOf`` gives)."""
    receipt = bundle["receipt"]
    routes = routes or {}
    schedule = {s["ordinal"]: s for s in receipt["schedule"]}
    attempts: List[SpanDescription] = []
    for a in bundle["attempts"]["attempts"]:
        s = schedule.get(a["ordinal"])
        route = routes.get(a["route_id"], {})
        outcome = a["outcome"]
        attributes: Attributes = {
            "retryledger.route_id": a["route_id"],
            "retryledger.ordinal": a["ordinal"],
            "retryledger.route_ordinal": a["route_ordinal"],
            "retryledger.route_release_sha256": a["route_release_sha256"],
            "retryledger.outcome.class": outcome["class"],
            "retryledger.cost": a["cost"],
        }
        if a["ordinal"] > 1:
            attributes["http.request.resend_count"] = a["ordinal"] - 1
        if operation is not None:
            attributes["gen_ai.operation.name"] = operation
        if "provider" in route:
            attributes["gen_ai.provider.name"] = route["provider"]
        requested, served = _models(a, route)
        if requested is not None:
            attributes["gen_ai.request.model"] = requested
        if served is not None:
            attributes["gen_ai.response.model"] = served
        attributes.update(_usage_tokens(a.get("usage")))
        if s is not None:
            attributes["retryledger.delay_ms"] = s["delay_ms"]
            attributes["retryledger.not_before_ms"] = s["not_before_ms"]
            attributes["retryledger.retry_after_floor_ms"] = s["retry_after_floor_ms"]
        error: Optional[str] = None
        if outcome["class"] != "success":
            error = outcome["kind"]
            attributes["retryledger.outcome.kind"] = error
        breaker = (a.get("admission") or {}).get("breaker")
        if breaker is not None:
            attributes["retryledger.breaker.generation"] = breaker["generation"]
            attributes["retryledger.breaker.probe"] = breaker["probe"]
        if "reconciled" in a:
            attributes["retryledger.reconciled"] = a["reconciled"]
        if error is not None:
            attributes["error.type"] = error
        name = _span_name(operation, requested, "retryledger.attempt")
        attempts.append(SpanDescription(name, a["started_at_ms"], a["completed_at_ms"], attributes, error))
    final_id = receipt.get("final_route_id")
    final = routes.get(final_id, {}) if final_id is not None else {}
    last = bundle["attempts"]["attempts"][-1] if bundle["attempts"]["attempts"] else None
    final_requested, final_served = _models(last, final) if last is not None else (final.get("model"), None)
    run_attributes: Attributes = {
        "retryledger.terminal": receipt["terminal"],
        "retryledger.attempt_count": receipt["attempt_count"],
        "retryledger.fallback_used": receipt["fallback_used"],
        "retryledger.total_cost": receipt["total_cost"],
        "retryledger.policy_sha256": receipt["policy_sha256"],
        "retryledger.attempts_sha256": receipt["attempts_sha256"],
        "retryledger.receipt_sha256": receipt_sha256,
    }
    if operation is not None:
        run_attributes["gen_ai.operation.name"] = operation
    if final_id is not None:
        run_attributes["retryledger.final_route_id"] = final_id
    if "provider" in final:
        run_attributes["gen_ai.provider.name"] = final["provider"]
    if final_requested is not None:
        run_attributes["gen_ai.request.model"] = final_requested
    if final_served is not None:
        run_attributes["gen_ai.response.model"] = final_served
    run_error: Optional[str] = None
    if receipt["terminal"] != "completed":
        run_error = receipt["terminal"]
        run_attributes["error.type"] = run_error
    run = SpanDescription(
        _span_name(operation, final_requested, "retryledger.run"), 0, receipt["finished_at_ms"], run_attributes, run_error
    )
    return RunSpans(run, attempts)


class RunTelemetry:
    """Records sealed runs as spans (on ``tracer``) and measurements (on
    ``meter``, when given): counters ``retryledger.attempts`` (by route,
    outcome class and error type) and ``retryledger.runs`` (by terminal),
    histograms ``retryledger.attempt.duration`` and ``retryledger.run.duration``
    in seconds."""

    def __init__(
        self,
        tracer: Optional[Tracer] = None,
        meter: Optional[Meter] = None,
        *,
        operation: Optional[str] = None,
        routes: Optional[Mapping[str, Mapping[str, str]]] = None,
    ) -> None:
        self.tracer = tracer if tracer is not None else trace.get_tracer("retryledger")
        self.operation = operation
        self.routes = dict(routes or {})
        self._attempts = self._runs = self._run_duration = self._attempt_duration = None
        if meter is not None:
            self._attempts = meter.create_counter("retryledger.attempts", "{attempt}", "Physical attempts, by route and outcome")
            self._runs = meter.create_counter("retryledger.runs", "{run}", "Logical runs, by terminal")
            self._run_duration = meter.create_histogram("retryledger.run.duration", "s", "Duration of a logical run")
            self._attempt_duration = meter.create_histogram("retryledger.attempt.duration", "s", "Duration of one attempt")

    def record(
        self, run: Any, started_at_unix_ms: Optional[int] = None, parent: Optional[otel_context.Context] = None
    ) -> RunSpans:
        """Write the spans (and measurements) of a run result, a
        :class:`retryledger.RunStoppedError` or anything with ``bundle`` and
        ``receipt_sha256``. ``started_at_unix_ms`` is the wall clock when the
        run started (default: now minus the run's ``finished_at_ms``, right
        for a run recorded as it ends). The run span is a child of ``parent``
        (default: the current context). Returns the description written."""
        bundle = getattr(run, "bundle", None)
        digest = getattr(run, "receipt_sha256", None)
        if not isinstance(bundle, Mapping) or not isinstance(digest, str):
            raise TypeError("record() takes a run result, a RunStoppedError or a sealed run")
        spans = spans_of(bundle, digest, operation=self.operation, routes=self.routes)
        t0 = started_at_unix_ms if started_at_unix_ms is not None else time.time_ns() // 1_000_000 - spans.run.end_ms

        def at(ms: int) -> int:
            return (t0 + ms) * 1_000_000

        base = parent if parent is not None else otel_context.get_current()
        run_span = self.tracer.start_span(
            spans.run.name, context=base, kind=SpanKind.INTERNAL, attributes=spans.run.attributes, start_time=at(spans.run.start_ms)
        )
        if spans.run.error is not None:
            run_span.set_status(Status(StatusCode.ERROR, spans.run.error))
        in_run = trace.set_span_in_context(run_span, base)
        for a in spans.attempts:
            span = self.tracer.start_span(a.name, context=in_run, kind=SpanKind.CLIENT, attributes=a.attributes, start_time=at(a.start_ms))
            if a.error is not None:
                span.set_status(Status(StatusCode.ERROR, a.error))
            span.end(end_time=at(a.end_ms))
            labels: Attributes = {
                "retryledger.route_id": a.attributes["retryledger.route_id"],
                "retryledger.outcome.class": a.attributes["retryledger.outcome.class"],
            }
            if a.error is not None:
                labels["error.type"] = a.error
            if self._attempts is not None:
                self._attempts.add(1, labels)
            if self._attempt_duration is not None:
                self._attempt_duration.record((a.end_ms - a.start_ms) / 1000.0, labels)
        run_span.end(end_time=at(spans.run.end_ms))
        terminal: Attributes = {"retryledger.terminal": spans.run.attributes["retryledger.terminal"]}
        if self._runs is not None:
            self._runs.add(1, terminal)
        if self._run_duration is not None:
            self._run_duration.record(spans.run.end_ms / 1000.0, terminal)
        return spans
