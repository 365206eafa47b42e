"""Pydantic AI: a ``Model`` that runs its routes' models under a policy.

:class:`RetryledgerModel` takes ``FallbackModel``'s constructor (a default
model and fallback models, instances or names) plus the policy spec, and is
a ``FallbackModel`` wherever one is expected: the models are the spec's
routes in priority order. Each model request the agent makes is one logical
request, run by :func:`retryledger.run_async`: it plans each attempt, waits,
calls the planned route's model once, judges what it raised (the provider
SDK's error, which Pydantic AI wraps in ``ModelHTTPError`` /
``ModelAPIError``) and seals the run. The receipt is in the response's
``provider_details["retryledger"]`` (``receipt_sha256``, ``terminal``,
``receipt``, ``bundle_json``, ``chain`` after a repair)::

    model = RetryledgerModel(OpenAIChatModel("gpt-4.1-mini", provider=OpenAIProvider(openai_client=AsyncOpenAI(max_retries=0))),
                             AnthropicModel("claude-sonnet-4-5", provider=AnthropicProvider(anthropic_client=AsyncAnthropic(max_retries=0))),
                             policy=spec)
    result = Agent(model).run_sync("Summarize INC-4471")
    result.response.provider_details["retryledger"]["receipt_sha256"]

``policy`` is a policy spec (``retryledger.policy_spec.v1``; it may carry a
``repair`` section): each request's policy is built from it, the logical
request (``retryledger.request.v1``, operation ``pydantic_ai.request``: the
messages as ``ModelMessagesTypeAdapter`` dumps them, the function and output
tools, the output mode) and the digest of a fresh key.

A route model whose SDK client retries (``max_retries`` not 0: the openai
and anthropic SDKs' default is 2, which a model built from a name or a
default provider gets) is refused before any request with
``PolicyError("retry_owner_not_harness")``, and so is ``fallback_on``
(the core decides what falls back). A streamed request (``Agent.run_stream``,
for a policy with a ``stream`` section) runs :func:`retryledger.run_stream_async`
over the routes' streams and hands the agent the completing attempt's
response once the run completed: a cut stream's events never reach it.
docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.exceptions import ModelAPIError
from pydantic_ai.models import KnownModelName, Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.settings import ModelSettings
from pydantic_core import to_jsonable_python

from ._driver import Step, run_async as _run_async
from ._stream import StreamStep, run_stream_async as _run_stream_async
from ._errors import PolicyError
from ._frameworks import STOPS, CallPolicy, charge, driver_options, record, refuse_sdk_clients, route_ids, spec_of, summary, template_of
from ._sending import sending
from .checks import OutputCheck

__all__ = ["RetryledgerModel", "output_of", "output_checks", "retry_prompt", "require_no_retries", "DETAILS_KEY"]

#: The key of ``provider_details`` that holds the run.
DETAILS_KEY = "retryledger"

#: ``repair(messages, response, defects) -> messages``: the messages of the
#: next logical request after a response the checks refused.
Repair = Callable[[List[ModelMessage], ModelResponse, List[Dict[str, Any]]], Sequence[ModelMessage]]


def output_of(response: Any) -> Optional[str]:
    """What a response answers, as text for a check: the JSON arguments of its
    first tool call (an output tool's call carries the structured output),
    else its text; ``None`` when it has neither."""
    for part in getattr(response, "parts", ()):
        if isinstance(part, ToolCallPart):
            args = part.args
            return args if isinstance(args, str) else json.dumps(args or {})
    texts = [p.content for p in getattr(response, "parts", ()) if isinstance(p, TextPart)]
    return "".join(texts) if texts else None


def output_checks(validators: Sequence[OutputCheck] = ()) -> List[OutputCheck]:
    """``validators`` (:mod:`retryledger.checks`) run on :func:`output_of`
    each response, for ``options={"checks": ...}``."""
    return [v.on(output_of) for v in validators]


def retry_prompt(messages: List[ModelMessage], response: ModelResponse, defects: List[Dict[str, Any]]) -> List[ModelMessage]:
    """A repair worded as Pydantic AI words its own output retry: the refused
    response, then the defects as a retried return of the tool call that
    carried the output (or as a user prompt after a text answer)."""
    said = "; ".join(f"{d.get('path') or '/'}: {d.get('message', '')}" for d in defects)
    text = f"Validation failed ({said}); fix the errors and try again."
    call = next((p for p in response.parts if isinstance(p, ToolCallPart)), None)
    part: Any
    if call is not None:
        part = ToolReturnPart(tool_name=call.tool_name, content=text, tool_call_id=call.tool_call_id, outcome="retried")
    else:
        part = UserPromptPart(content=text)
    return [*messages, response, ModelRequest(parts=[part])]


def require_no_retries(model: Any, route_id: str = "") -> None:
    """Refuse a route's model whose SDK client retries on its own."""
    what = f"the model of route {route_id!r}" if route_id else "the model"
    client = getattr(model, "client", None)
    if client is None:
        raise PolicyError(
            "retry_owner_not_harness",
            f"{what} has no SDK client whose retries can be read; give a model built on an "
            "openai or anthropic client with max_retries=0",
            "/max_retries",
        )
    refuse_sdk_clients([client], what)


def _params_document(params: ModelRequestParameters) -> Dict[str, Any]:
    tools: Dict[str, Any] = {}
    if params.function_tools:
        tools["function_tools"] = to_jsonable_python(params.function_tools)
    if params.output_tools:
        tools["output_tools"] = to_jsonable_python(params.output_tools)
    return tools


class RetryledgerModel(FallbackModel):
    """``FallbackModel``'s shape, run under the policy (see the module)."""

    def __init__(
        self,
        default_model: Model | KnownModelName | str,
        *fallback_models: Model | KnownModelName | str,
        policy: Any,
        options: Optional[Mapping[str, Any]] = None,
        repair: Optional[Repair] = None,
        key_scope: Optional[Tuple[str, str]] = None,
        fallback_on: Any = None,
    ) -> None:
        if fallback_on is not None:
            raise PolicyError(
                "retry_owner_not_harness",
                "fallback_on decides fallbacks outside the policy; the core judges every error",
                "/fallback_on",
            )
        spec = spec_of(policy)
        super().__init__(default_model, *fallback_models)
        ids = route_ids(spec)
        if len(ids) != len(self.models):
            raise PolicyError(
                "route_model_missing",
                f"the policy has {len(ids)} route(s) and {len(self.models)} model(s) were given: one model per route, in priority order",
                "/routes",
            )
        for route_id, model in zip(ids, self.models):
            require_no_retries(model, route_id)
        driver_options(options or {})
        self._spec = spec
        self._template = template_of(spec)
        self._routes: Dict[str, Model] = dict(zip(ids, self.models))
        self._options = dict(options or {})
        self._repair = repair
        self._key_scope = key_scope

    @property
    def model_name(self) -> str:
        return f'retryledger:{",".join(model.model_name for model in self.models)}'

    def _request_document(self, messages: List[ModelMessage], params: ModelRequestParameters) -> Dict[str, Any]:
        dumped: List[Dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
        for message in dumped:  # an earlier response's receipt is not part of what is asked
            details = message.get("provider_details")
            if isinstance(details, dict) and DETAILS_KEY in details:
                message["provider_details"] = {k: v for k, v in details.items() if k != DETAILS_KEY} or None
        request: Dict[str, Any] = {
            "schema": "retryledger.request.v1",
            "operation": "pydantic_ai.request",
            "input": dumped,
        }
        tools = _params_document(params)
        if tools:
            request["tools"] = tools
        request["output_contract"] = {"mode": params.output_mode, "allow_text_output": params.allow_text_output}
        return request

    async def request(
        self,
        messages: List[ModelMessage],
        model_settings: Optional[ModelSettings],
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """One logical request: the drivers' run over the routes' models."""
        call = CallPolicy(self._spec, self._request_document(messages, model_request_parameters), None, self._key_scope, self._template)

        async def dispatch(step: Step) -> ModelResponse:
            model = self._routes[step.route_id]
            sent = messages
            repaired = getattr(step, "request", None)
            if getattr(step, "repair_ordinal", 0) and isinstance(repaired, dict):
                sent = ModelMessagesTypeAdapter.validate_python(repaired["input"])
            prepared = model.prepare_messages(sent, model_request_parameters)
            try:
                with sending(step):
                    response = await model.request(prepared, model_settings, model_request_parameters)
            except ModelAPIError as exc:
                # The SDK's own error (its class, status, headers and body)
                # is what the core judges; Pydantic AI's wrapper keeps it as the cause.
                cause = exc.__cause__
                if isinstance(cause, Exception):
                    raise cause
                raise
            charge(step, response.usage)
            return response

        repair = None
        if self._repair is not None:
            fix: Repair = self._repair
            current = [list(messages)]

            def repair(response: Any, defects: List[Dict[str, Any]]) -> Dict[str, Any]:
                nxt = list(fix(current[0], response, defects))
                current[0] = nxt
                return self._request_document(nxt, model_request_parameters)

        try:
            result = await _run_async(
                call.policy, dispatch, call.key, key_scope=call.key_scope, repair=repair, request=call.request,
                **driver_options(self._options, is_async=True),
            )
        except STOPS as stopped:
            record(self._options, stopped)
            raise
        record(self._options, result)
        response = result.value
        response.provider_details = {**(response.provider_details or {}), DETAILS_KEY: summary(result)}
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: List[ModelMessage],
        model_settings: Optional[ModelSettings],
        model_request_parameters: ModelRequestParameters,
        run_context: Any = None,
    ) -> AsyncGenerator[StreamedResponse, None]:
        """One logical request streamed by :func:`retryledger.run_stream_async`
        over the routes' streams; the response is handed to the agent once
        the run completed (a failed attempt's events never reach it), as a
        replay of the completing attempt's parts."""
        if self._options.get("checks") or self._repair is not None:
            raise PolicyError(
                "stream_checks_unsupported",
                "output checks and repair judge a whole response: use Agent.run / run_sync",
                "/options/checks",
            )
        call = CallPolicy(self._spec, self._request_document(messages, model_request_parameters), None, self._key_scope, self._template)
        # The stream modes a Pydantic AI stream cannot carry are the core's rule (invalid_stream_contract).
        call.policy._compiled.require_driver("pydantic_ai")
        finals: Dict[int, ModelResponse] = {}

        async def dispatch(step: StreamStep) -> AsyncIterator[Any]:
            model = self._routes[step.route_id]
            prepared = model.prepare_messages(messages, model_request_parameters)
            try:
                with sending(step):
                    async with model.request_stream(prepared, model_settings, model_request_parameters, run_context) as streamed:
                        async for event in streamed:
                            yield event
                        response = streamed.get()
            except ModelAPIError as exc:
                cause = exc.__cause__
                if isinstance(cause, Exception):
                    raise cause
                raise
            charge(step, response.usage)
            finals[step.ordinal] = response

        run = _run_stream_async(
            call.policy, dispatch, call.key, reader=_EVENT_READER, key_scope=call.key_scope,
            **driver_options(self._options, stream=True, is_async=True),
        )
        try:
            async with run:
                async for _ in run:
                    pass
        except STOPS as stopped:
            record(self._options, stopped)
            raise
        record(self._options, run)
        final = finals[max(finals)]
        final.provider_details = {**(final.provider_details or {}), DETAILS_KEY: summary(run)}
        yield _Replay(model_request_parameters=model_request_parameters, _response=final)


class _EventReader:
    """Pydantic AI's stream events as the stream driver reads them: the text
    of text parts and their deltas; the end of the route's stream is its
    terminal event."""

    terminal_at_end = True

    def text(self, event: Any) -> str:
        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
            return event.part.content
        if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
            return event.delta.content_delta
        return ""

    def sequence(self, event: Any) -> Optional[int]:
        return None

    def response_id(self, event: Any) -> Optional[str]:
        return None

    def is_terminal(self, event: Any) -> bool:
        return False

    def usage(self, event: Any) -> Optional[Mapping[str, Any]]:
        return None


_EVENT_READER = _EventReader()


@dataclass
class _Replay(StreamedResponse):
    """The completing attempt's response, handed to the agent part by part."""

    _response: ModelResponse

    def __post_init__(self) -> None:
        self._usage = self._response.usage
        self.provider_details = self._response.provider_details
        self.provider_response_id = self._response.provider_response_id
        self.finish_reason = self._response.finish_reason

    async def _get_event_iterator(self) -> AsyncIterator[ModelResponseStreamEvent]:
        for index, part in enumerate(self._response.parts):
            yield self._parts_manager.handle_part(vendor_part_id=index, part=part)

    @property
    def model_name(self) -> str:
        return self._response.model_name or ""

    @property
    def provider_name(self) -> Optional[str]:
        return self._response.provider_name

    @property
    def provider_url(self) -> Optional[str]:
        return self._response.provider_url

    @property
    def timestamp(self) -> datetime:
        return self._response.timestamp
