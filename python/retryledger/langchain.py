"""LangChain: a chat model that runs its routes' chat models under a policy.

:class:`RetryledgerChatModel` is a ``langchain_core`` ``BaseChatModel`` over
one chat model per route id (``ChatOpenAI``, ``ChatAnthropic``, any chat
model); each call (``invoke``, ``ainvoke``, ``stream``, ``astream``,
``batch``) is one logical request, run by the package's drivers
(:func:`retryledger.run`, :func:`retryledger.run_async`,
:func:`retryledger.run_stream`, :func:`retryledger.run_stream_async`):
they plan each attempt, wait, call the planned route's model once, judge
what it raised (the provider SDK's exceptions, which LangChain passes on)
and seal the run. The receipt is in the answer's
``response_metadata["retryledger"]`` (``receipt_sha256``, ``terminal``,
``receipt``, ``bundle_json``, and ``chain`` after a repair)::

    model = RetryledgerChatModel(spec, {"primary": ChatOpenAI(model=..., max_retries=0),
                                        "fallback": ChatAnthropic(model=..., max_retries=0)})
    answer = model.invoke("Summarize INC-4471")
    answer.response_metadata["retryledger"]["receipt_sha256"]

``spec`` is a policy spec (``retryledger.policy_spec.v1``); each call's
policy is built from it, the logical request (``retryledger.request.v1``,
operation ``langchain.chat``: the messages as ``messages_to_dict`` writes
them, the bound tools, ``stop``) and the digest of the call's idempotency
key (``idempotency_key=`` on the call, else a fresh random key).

Retries at two layers multiply, so these are refused before any request
with ``PolicyError("retry_owner_not_harness")``: a route model whose
``max_retries`` is not 0 (``ChatOpenAI``'s default leaves the SDK's 2,
``ChatAnthropic``'s is 2) or whose SDK client retries; a route wrapped in
``with_retry`` or ``with_fallbacks``; and ``with_retry`` or
``with_fallbacks`` over this model. ``bind_tools`` binds the tools on every
route's model (and the tools enter the logical request);
``with_structured_output`` works through it. docs/INTEGRATIONS.md.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, messages_from_dict, messages_to_dict
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableBinding
from langchain_core.runnables.fallbacks import RunnableWithFallbacks
from langchain_core.runnables.retry import RunnableRetry
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict

from ._driver import Step, run as _run, run_async as _run_async
from ._errors import PolicyError
from ._frameworks import (
    STOPS,
    CallPolicy,
    charge,
    check_routes,
    driver_options,
    record,
    refuse_retries,
    refuse_sdk_clients,
    spec_of,
    template_of,
    summary,
)
from ._sending import sending
from ._stream import StreamEvent, StreamStep, run_stream as _run_stream, run_stream_async as _run_stream_async
from .checks import OutputCheck

__all__ = ["RetryledgerChatModel", "ChunkReader", "text_of", "text_checks", "require_no_retries", "METADATA_KEY"]

#: The key of ``response_metadata`` that holds the run.
METADATA_KEY = "retryledger"

#: ``repair(messages, answer, defects) -> messages``: the messages of the next
#: logical request after an answer the checks refused.
Repair = Callable[[List[BaseMessage], Any, List[Dict[str, Any]]], Sequence[BaseMessage]]


def text_of(answer: Any) -> str:
    """An answer's text (an ``AIMessage``'s ``.text``)."""
    text = getattr(answer, "text", None)
    if isinstance(text, str):  # a property (a str that may also be called)
        return str(text)
    if callable(text):  # older langchain-core: a method
        text = text()
    return text if isinstance(text, str) else ""


def text_checks(validators: Sequence[OutputCheck] = ()) -> List[OutputCheck]:
    """``validators`` (:mod:`retryledger.checks`) run on the answer's text,
    for ``options={"checks": ...}``."""
    return [v.on(text_of) for v in validators]


def _unwrapped(model: Any) -> Any:
    while isinstance(model, RunnableBinding):
        model = model.bound
    return model


def require_no_retries(model: Any, route_id: str = "") -> None:
    """Refuse a route's chat model that retries on its own (its
    ``max_retries``, or its SDK clients'), or that is wrapped in LangChain's
    ``with_retry`` / ``with_fallbacks``."""
    what = f"the chat model of route {route_id!r}" if route_id else "the chat model"
    inner = _unwrapped(model)
    if isinstance(inner, RunnableRetry):
        raise PolicyError(
            "retry_owner_not_harness",
            f"{what} is wrapped in with_retry(); give the route the bare chat model",
            "/with_retry",
        )
    if isinstance(inner, RunnableWithFallbacks):
        raise PolicyError(
            "retry_owner_not_harness",
            f"{what} is wrapped in with_fallbacks(); make each fallback a route of the policy",
            "/with_fallbacks",
        )
    if not isinstance(inner, BaseChatModel):
        raise PolicyError("route_model_invalid", f"{what} is not a langchain_core chat model", "/routes")
    if "max_retries" in type(inner).model_fields:
        refuse_retries(getattr(inner, "max_retries", None), what)
    clients = [getattr(inner, name, None) for name in ("root_client", "root_async_client")]
    if type(inner).__name__ == "ChatAnthropic":  # its clients are built on first use
        clients += [getattr(inner, "_client", None), getattr(inner, "_async_client", None)]
    refuse_sdk_clients(clients, what)


def _for_request(messages: Sequence[BaseMessage]) -> List[Dict[str, Any]]:
    """The messages as the logical request holds them (without a receipt an
    earlier answer carries)."""
    out = messages_to_dict(list(messages))
    for item in out:
        meta = item.get("data", {}).get("response_metadata")
        if isinstance(meta, dict) and METADATA_KEY in meta:
            item["data"]["response_metadata"] = {k: v for k, v in meta.items() if k != METADATA_KEY}
    return out


class ChunkReader:
    """LangChain message chunks as the stream driver reads them: the text is
    the chunk's text, the chunk LangChain marks ``chunk_position="last"``
    (yielded once the provider's stream ended) is the terminal event."""

    def text(self, event: Any) -> str:
        return text_of(event)

    def sequence(self, event: Any) -> Optional[int]:
        return None

    def response_id(self, event: Any) -> Optional[str]:
        return None

    def is_terminal(self, event: Any) -> bool:
        return getattr(event, "chunk_position", None) == "last"

    def usage(self, event: Any) -> Optional[Mapping[str, Any]]:
        return None


_READER = ChunkReader()


class RetryledgerChatModel(BaseChatModel):
    """A chat model over one chat model per route id, each call one logical
    request run under the policy built from ``spec`` (see the module)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    spec: Dict[str, Any]
    routes: Dict[str, Any]
    options: Dict[str, Any] = {}
    repair: Optional[Any] = None
    key_scope: Optional[Tuple[str, str]] = None
    tools: List[Dict[str, Any]] = []
    template: Optional[Any] = None

    def __init__(
        self,
        spec: Any,
        routes: Mapping[str, Any],
        *,
        options: Optional[Mapping[str, Any]] = None,
        repair: Optional[Repair] = None,
        key_scope: Optional[Tuple[str, str]] = None,
        tools: Sequence[Mapping[str, Any]] = (),
        **kwargs: Any,
    ) -> None:
        document = spec_of(spec)
        if not isinstance(routes, Mapping):
            raise PolicyError("route_model_invalid", "routes is a mapping of route id to chat model", "/routes")
        check_routes(document, routes, "chat model")
        for route_id, model in routes.items():
            require_no_retries(model, route_id)
        driver_options(options or {})  # unknown names refused here, before any call
        fields: Dict[str, Any] = dict(
            spec=document, routes=dict(routes), options=dict(options or {}), repair=repair,
            key_scope=key_scope, tools=[dict(t) for t in tools], template=template_of(document),
        )
        super().__init__(**fields, **kwargs)

    @property
    def _llm_type(self) -> str:
        return "retryledger"

    @property
    def _identifying_params(self) -> Dict[str, Any]:
        return {"routes": list(self.routes), "spec_schema": self.spec.get("schema")}

    # ---- refusals and bindings ------------------------------------------------

    def with_retry(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: retryledger owns every retry of this model's calls."""
        raise PolicyError(
            "retry_owner_not_harness",
            "with_retry() over a RetryledgerChatModel stacks a second retry layer; "
            "set the attempts in the policy instead",
            "/with_retry",
        )

    def with_fallbacks(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: the policy's routes are this model's fallbacks."""
        raise PolicyError(
            "retry_owner_not_harness",
            "with_fallbacks() over a RetryledgerChatModel stacks a second fallback layer; "
            "make each fallback a route of the policy",
            "/with_fallbacks",
        )

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Optional[Any] = None, **kwargs: Any) -> Runnable[Any, Any]:
        """The same model with ``tools`` bound on every route's chat model
        (``tool_choice`` and the other keywords passed to each route's
        ``bind_tools``); the tools enter each call's logical request."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        bound = {rid: m.bind_tools(tools, **kwargs) for rid, m in self.routes.items()}
        described = [convert_to_openai_tool(t) for t in tools]
        return RetryledgerChatModel(
            self.spec, bound, options=self.options, repair=self.repair, key_scope=self.key_scope,
            tools=[*self.tools, *described],
        )

    # ---- one call -------------------------------------------------------------

    def _call(self, messages: List[BaseMessage], stop: Optional[List[str]], key: Optional[str]) -> CallPolicy:
        request: Dict[str, Any] = {
            "schema": "retryledger.request.v1",
            "operation": "langchain.chat",
            "input": _for_request(messages),
        }
        if self.tools:
            request["tools"] = {"tools": self.tools}
        if stop:
            request["sampling"] = {"stop": list(stop)}
        return CallPolicy(self.spec, request, key, self.key_scope, self.template)

    def _messages(self, step: Step, messages: List[BaseMessage]) -> List[BaseMessage]:
        repaired = getattr(step, "request", None)
        if getattr(step, "repair_ordinal", 0) and isinstance(repaired, dict):
            return messages_from_dict(repaired["input"])
        return messages

    def _repair_for(self, call: CallPolicy, messages: List[BaseMessage]) -> Optional[Callable[[Any, List[Dict[str, Any]]], Any]]:
        if self.repair is None:
            return None
        fix: Repair = self.repair
        current = [list(messages)]

        def repair(answer: Any, defects: List[Dict[str, Any]]) -> Dict[str, Any]:
            nxt = list(fix(current[0], answer, defects))
            current[0] = nxt
            request = dict(call.request)
            request["input"] = _for_request(nxt)
            return request

        return repair

    def _finish(self, result: Any) -> ChatResult:
        message = result.value
        if not isinstance(message, BaseMessage):
            raise PolicyError("route_model_invalid", "a route's chat model returned no message", "/routes")
        message.response_metadata = {**message.response_metadata, METADATA_KEY: summary(result)}
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: List[BaseMessage],
        stop: Optional[List[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> ChatResult:
        key = kwargs.pop("idempotency_key", None)
        call = self._call(messages, stop, key)

        def dispatch(step: Step) -> BaseMessage:
            model = self.routes[step.route_id]
            with sending(step):
                answer: BaseMessage = model.invoke(self._messages(step, messages), stop=stop, **kwargs)
            charge(step, getattr(answer, "usage_metadata", None))
            return answer

        try:
            result = _run(
                call.policy, dispatch, call.key, key_scope=call.key_scope,
                repair=self._repair_for(call, messages), request=call.request, **driver_options(self.options),
            )
        except STOPS as stopped:
            record(self.options, stopped)
            raise
        record(self.options, result)
        return self._finish(result)

    async def _agenerate(
        self,
        messages: List[BaseMessage],
        stop: Optional[List[str]] = None,
        run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> ChatResult:
        key = kwargs.pop("idempotency_key", None)
        call = self._call(messages, stop, key)

        async def dispatch(step: Step) -> BaseMessage:
            model = self.routes[step.route_id]
            with sending(step):
                answer: BaseMessage = await model.ainvoke(self._messages(step, messages), stop=stop, **kwargs)
            charge(step, getattr(answer, "usage_metadata", None))
            return answer

        try:
            result = await _run_async(
                call.policy, dispatch, call.key, key_scope=call.key_scope,
                repair=self._repair_for(call, messages), request=call.request,
                **driver_options(self.options, is_async=True),
            )
        except STOPS as stopped:
            record(self.options, stopped)
            raise
        record(self.options, result)
        return self._finish(result)

    # ---- streams --------------------------------------------------------------

    def _stream_call(self, messages: List[BaseMessage], stop: Optional[List[str]], kwargs: Dict[str, Any]) -> CallPolicy:
        if self.options.get("checks") or self.repair is not None:
            raise PolicyError(
                "stream_checks_unsupported",
                "output checks and repair judge a whole answer: call invoke(), not stream()",
                "/options/checks",
            )
        call = self._call(messages, stop, kwargs.pop("idempotency_key", None))
        # The stream modes a LangChain stream cannot carry are the core's rule (invalid_stream_contract).
        call.policy._compiled.require_driver("langchain")
        return call

    @staticmethod
    def _chunk(event: StreamEvent) -> Optional[ChatGenerationChunk]:
        data = event.data
        if event.kind != "delta" or not isinstance(data, AIMessageChunk) or data.chunk_position == "last":
            return None
        return ChatGenerationChunk(message=data)

    @staticmethod
    def _last(run: Any) -> ChatGenerationChunk:
        return ChatGenerationChunk(
            message=AIMessageChunk(content="", chunk_position="last", response_metadata={METADATA_KEY: summary(run)})
        )

    def _stream(
        self,
        messages: List[BaseMessage],
        stop: Optional[List[str]] = None,
        run_manager: Optional[CallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._stream_call(messages, stop, kwargs)

        def dispatch(step: StreamStep) -> Iterator[Any]:
            model = self.routes[step.route_id]
            with sending(step):
                yield from model.stream(messages, stop=stop, **kwargs)

        run = _run_stream(
            call.policy, dispatch, call.key, reader=_READER, key_scope=call.key_scope,
            **driver_options(self.options, stream=True),
        )
        try:
            with run:
                for event in run:
                    chunk = self._chunk(event)
                    if chunk is not None:
                        if run_manager is not None:
                            run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                        yield chunk
        except STOPS as stopped:
            record(self.options, stopped)
            raise
        record(self.options, run)
        yield self._last(run)

    async def _astream(
        self,
        messages: List[BaseMessage],
        stop: Optional[List[str]] = None,
        run_manager: Optional[AsyncCallbackManagerForLLMRun] = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._stream_call(messages, stop, kwargs)

        async def opened(step: StreamStep) -> AsyncIterator[Any]:
            model = self.routes[step.route_id]
            with sending(step):
                async for chunk in model.astream(messages, stop=stop, **kwargs):
                    yield chunk

        run = _run_stream_async(
            call.policy, opened, call.key, reader=_READER, key_scope=call.key_scope,
            **driver_options(self.options, stream=True, is_async=True),
        )
        try:
            async with run:
                async for event in run:
                    chunk = self._chunk(event)
                    if chunk is not None:
                        if run_manager is not None:
                            await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                        yield chunk
        except STOPS as stopped:
            record(self.options, stopped)
            raise
        record(self.options, run)
        yield self._last(run)
