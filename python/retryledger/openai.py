"""Integration with the ``openai`` package: retryledger owns every retry.

The SDK retries on its own (``max_retries`` defaults to 2), so under a harness
that also retries, one logical call becomes up to 3 x 3 requests. These
drivers refuse any client whose ``max_retries`` is not 0, send the same
``Idempotency-Key`` on every attempt and pass the remaining deadline as the
request timeout. The SDK's exceptions need no mapping here: the drivers pass
their facts (class names along the cause chain, ``status_code``,
``response.headers``, the body of ``response.text``) to the core, whose
tables know the SDK's error classes (``APIConnectionError``,
``APITimeoutError``, ``APIResponseValidationError``, httpx's
``ConnectError``, ...) and whose HTTP rules judge every status
(docs/HOSTS.md); for a route that names its provider family (``openai``)
the provider table reads the body, so ``insufficient_quota`` stops the run
(``quota_exhausted``, docs/PROVIDERS.md).

    clients = {"primary": OpenAI(max_retries=0, ...), "fallback": OpenAI(max_retries=0, ...)}
    result = retryledger.openai.run(
        policy, clients,
        lambda client, step: client.chat.completions.create(model=..., messages=...),
        idempotency_key,
    )

Streams: :func:`stream_chat_completions` (``stream=True``,
``stream_options={"include_usage": True}``) and :func:`stream_responses`
(``stream=True, background=True``; a resumption under the ``continuation``
mode is ``responses.retrieve(id, stream=True, starting_after=N)``) and their
``_async`` twins run :func:`retryledger.run_stream` under the policy's stream
contract; :func:`run_stream` takes any ``call(client, step)`` with a reader
(:data:`CHAT_READER`, :data:`RESPONSES_READER`). Each attempt's client
carries the Idempotency-Key and the stream's read timeout.

    for event in retryledger.openai.stream_chat_completions(
        policy, clients, {"model": ..., "messages": ...}, idempotency_key
    ):
        ...  # event.kind: delta (event.text), invalidate, commit

For a policy with a ``fleet`` section every function takes ``fleet=`` (a
:class:`retryledger.fleet.Fleet`): each attempt is admitted against the
fleet's breakers and retry budget first, its outcome recorded after.

Usage is charged automatically when the run has a price schedule
(``price_schedule=``, checked against the policy before the first dispatch)
and the value ``call`` returns carries ``usage`` (return the SDK's response,
or anything with its ``usage``). The units, with only nonzero counts charged
so that a schedule without ``reasoning`` serves models without it:

=================  ===============================================  =====================================================
unit               chat completions (``usage.``)                    responses (``usage.``)
=================  ===============================================  =====================================================
``input``          ``prompt_tokens`` - ``cached_tokens``            ``input_tokens`` - ``cached_tokens``
``cached_input``   ``prompt_tokens_details.cached_tokens``          ``input_tokens_details.cached_tokens``
``output``         ``completion_tokens`` - ``reasoning_tokens``     ``output_tokens`` - ``reasoning_tokens``
``reasoning``      ``completion_tokens_details.reasoning_tokens``   ``output_tokens_details.reasoning_tokens``
=================  ===============================================  =====================================================

An attempt whose value carries no usage (a stream, a value ``call`` built
itself) keeps its reservation unless ``call`` reports it with
``step.usage(...)`` (:func:`usage_units` maps an SDK usage object). Usage the
schedule does not price raises the core's coded error (``usage_unpriced``)
out of the attempt, which ends the run as an unrecognized error: nothing is
silently left uncharged.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from .checks import OutputCheck, answer_checks as _answer_checks, openai_parts
from ._api import Document, Policy
from ._driver import AttemptCallback, DecisionCallback, RunCancelledError, RunResult, SleepCallback, Step, TerminalCallback
from .hedge import HedgeAttempt, HedgeRun
from ._integration import (
    IDEMPOTENCY_HEADER as IDEMPOTENCY_HEADER,
    Params as Params,
    _Sdk,
    field as _field,
    get as _get,
    params_for as _params,
    require_max_retries_zero,
)
from .fleet import Fleet
from ._stream import (
    AsyncStreamRun,
    StreamReader,
    StreamRun,
    StreamStep,
    run_stream as _run_stream,
    run_stream_async as _run_stream_async,
)

__all__ = [
    "IDEMPOTENCY_HEADER",
    "require_no_retries",
    "run",
    "run_async",
    "run_hedged_async",
    "usage_units",
    "answer_checks",
    "run_stream",
    "run_stream_async",
    "stream_chat_completions",
    "stream_chat_completions_async",
    "stream_responses",
    "stream_responses_async",
    "ChatReader",
    "ResponsesReader",
    "CHAT_READER",
    "RESPONSES_READER",
]

T = TypeVar("T")


def answer_checks(*, json: bool = False, validators: Sequence[OutputCheck] = ()) -> List[OutputCheck]:
    """The built-in output checks of openai answers, for ``checks=``
    (docs/REPAIR.md): ``refusal`` (policy_denied: never a fallback),
    ``truncated``, ``empty``, with ``json=True`` ``unparsable_json`` (a JSON
    output was asked for), then ``validators`` (:mod:`retryledger.checks`)
    run on the answer's text."""
    return _answer_checks("openai", openai_parts, json, validators)


def require_no_retries(client: Any) -> None:
    """Refuse a client that retries on its own: retries at two layers multiply."""
    require_max_retries_zero(client, "openai")


def _tokens(holder: Any, name: str) -> Any:
    value = _field(holder, name)
    return 0 if value is None else value


def usage_units(response: Any) -> Optional[Dict[str, Any]]:
    """The price units of a chat completion's or a response's ``usage`` (the
    SDK object or its dict form; a bare usage object is accepted too), only
    the nonzero ones; ``None`` when it carries no usage. See the module's table."""
    usage = _field(response, "usage")
    if usage is None:
        usage = response
    if _field(usage, "prompt_tokens") is not None:  # chat completions
        given, given_details, cached_name = "prompt_tokens", "prompt_tokens_details", "cached_tokens"
        made, made_details, reasoning_name = "completion_tokens", "completion_tokens_details", "reasoning_tokens"
    elif _field(usage, "input_tokens") is not None:  # responses
        given, given_details, cached_name = "input_tokens", "input_tokens_details", "cached_tokens"
        made, made_details, reasoning_name = "output_tokens", "output_tokens_details", "reasoning_tokens"
    else:
        return None
    cached = _tokens(_field(usage, given_details), cached_name)
    reasoning = _tokens(_field(usage, made_details), reasoning_name)
    units = {
        "input": _tokens(usage, given) - cached,
        "cached_input": cached,
        "output": _tokens(usage, made) - reasoning,
        "reasoning": reasoning,
    }
    return {kind: count for kind, count in units.items() if count != 0}


def run(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    call: Callable[[Any, Step], T],
    idempotency_key: str,
    *,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    reserve_tokens: Optional[int] = None,
    **options: Any,
) -> RunResult[T]:
    """:func:`retryledger.run` over openai clients, one per route id; with
    ``price_schedule`` the usage of each returned response is charged."""
    return _SDK.run(
        policy, clients, call, idempotency_key,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens, **options,
    )


async def run_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    call: Callable[[Any, Step], Awaitable[T]],
    idempotency_key: str,
    *,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_cancel: Optional[Callable[[RunCancelledError], None]] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    reserve_tokens: Optional[int] = None,
    **options: Any,
) -> RunResult[T]:
    """:func:`retryledger.run_async` over ``AsyncOpenAI`` clients, one per route
    id; with ``price_schedule`` the usage of each returned response is charged."""
    return await _SDK.run_async(
        policy, clients, call, idempotency_key,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt, on_cancel=on_cancel,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens, **options,
    )


async def run_hedged_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    call: Callable[[Any, HedgeAttempt], Awaitable[T]],
    idempotency_key: str,
    *,
    key_scope: Optional[Tuple[str, str]] = None,
) -> HedgeRun[T]:
    """:func:`retryledger.hedge.run_hedged_async` over ``AsyncOpenAI`` clients,
    one per route id, for a policy with a ``hedge`` section (docs/HEDGING.md):
    the lead and each hedge the core offers go to their route's client with
    the remaining deadline as timeout and the same Idempotency-Key; a loser's
    task is cancelled. Clients with ``max_retries`` other than 0 and routes
    without a client are refused before any request."""
    return await _SDK.run_hedged_async(policy, clients, call, idempotency_key, key_scope=key_scope)


# ---- streams ------------------------------------------------------------------
#
# The stream drivers (retryledger.run_stream) over openai clients. Each attempt
# gets the route's client with the Idempotency-Key and the stream's read
# timeout (the first-byte / idle limit, within the remaining deadline) as its
# timeout; the readers tell the driver what each SDK event means.

class ChatReader:
    """Chat completion chunks (``stream=True``): the text is
    ``choices[0].delta.content``; a chunk with a ``finish_reason`` is the
    terminal event (the SDK consumes ``[DONE]`` itself, so a stream that ends
    normally after that chunk is complete, and one that ends without it is
    not); the usage chunk of ``stream_options={"include_usage": True}`` is
    the usage event. Chunks carry no sequence numbers, so a chat stream is
    never resumed."""

    def text(self, event: Any) -> str:
        choices = _get(event, "choices")
        if not choices:
            return ""
        content = _get(_get(choices[0], "delta"), "content")
        return content if isinstance(content, str) else ""

    def sequence(self, event: Any) -> Optional[int]:
        return None

    def response_id(self, event: Any) -> Optional[str]:
        ident = _get(event, "id")
        return ident if isinstance(ident, str) and ident else None

    def is_terminal(self, event: Any) -> bool:
        for choice in _get(event, "choices") or ():
            if _get(choice, "finish_reason") is not None:
                return True
        return False

    def usage(self, event: Any) -> Optional[Mapping[str, Any]]:
        if _get(event, "usage") is None:
            return None
        return usage_units(event)


class ResponsesReader:
    """Responses API events (``stream=True``): the text of
    ``response.output_text.delta``, the ``sequence_number`` of every event,
    the response id of ``response.created`` (and of the other events that
    carry the response), ``response.completed`` as the terminal event and its
    usage. An ``error`` event, ``response.failed`` or ``response.incomplete``
    end the stream without the terminal event."""

    def text(self, event: Any) -> str:
        if type(event) is dict:
            kind, delta = event.get("type"), event.get("delta")
        else:
            kind = getattr(event, "type", None)
            if kind != "response.output_text.delta":
                return ""
            delta = getattr(event, "delta", None)
        if kind == "response.output_text.delta" and type(delta) is str:
            return delta
        return ""

    def read(self, event: Any) -> Tuple[str, Optional[int], bool, Optional[Mapping[str, Any]]]:
        """Text, sequence number, terminal and usage at once (the driver's hot path)."""
        if type(event) is dict:
            return self.text(event), self.sequence(event), self.is_terminal(event), self.usage(event)
        kind = getattr(event, "type", None)
        seq = getattr(event, "sequence_number", None)
        if type(seq) is not int:
            seq = None
        if kind == "response.output_text.delta":
            delta = getattr(event, "delta", None)
            return (delta if type(delta) is str else ""), seq, False, None
        if kind == "response.completed":
            return "", seq, True, self.usage(event)
        return "", seq, False, None

    def sequence(self, event: Any) -> Optional[int]:
        seq = event.get("sequence_number") if type(event) is dict else getattr(event, "sequence_number", None)
        return seq if type(seq) is int else None

    def response_id(self, event: Any) -> Optional[str]:
        ident = _get(_get(event, "response"), "id")
        return ident if isinstance(ident, str) and ident else None

    def is_terminal(self, event: Any) -> bool:
        kind = event.get("type") if type(event) is dict else getattr(event, "type", None)
        return bool(kind == "response.completed")

    def usage(self, event: Any) -> Optional[Mapping[str, Any]]:
        kind = event.get("type") if type(event) is dict else getattr(event, "type", None)
        if kind != "response.completed":
            return None
        response = _get(event, "response")
        if _get(response, "usage") is None:
            return None
        return usage_units(response)


CHAT_READER = ChatReader()
RESPONSES_READER = ResponsesReader()

_SDK = _Sdk("openai", usage_units, CHAT_READER, {})


def run_stream(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    call: Callable[[Any, StreamStep], Any],
    idempotency_key: str,
    *,
    reader: Optional[StreamReader[Any]] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    reserve_tokens: Optional[int] = None,
    now: Optional[Callable[[], int]] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> StreamRun:
    """:func:`retryledger.run_stream` over openai clients, one per route id:
    ``call(client, step)`` opens the stream with the route's client (carrying
    the idempotency key and the stream's read timeout); ``reader`` defaults to
    :data:`CHAT_READER`. With ``price_schedule`` the usage events are charged."""
    return _SDK.stream(
        _run_stream, policy, clients, call, idempotency_key, reader,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens,
        now=now, on_decision=on_decision, on_sleep=on_sleep, on_terminal=on_terminal,
    )


def run_stream_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    call: Callable[[Any, StreamStep], Any],
    idempotency_key: str,
    *,
    reader: Optional[StreamReader[Any]] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_cancel: Optional[Callable[[RunCancelledError], None]] = None,
    price_schedule: Optional[Document] = None,
    fleet: Optional[Fleet] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    reserve_tokens: Optional[int] = None,
    now: Optional[Callable[[], int]] = None,
    on_decision: Optional[DecisionCallback] = None,
    on_sleep: Optional[SleepCallback] = None,
    on_terminal: Optional[TerminalCallback] = None,
) -> AsyncStreamRun:
    """:func:`retryledger.run_stream_async` over ``AsyncOpenAI`` clients, one
    per route id: ``call(client, step)`` returns (an awaitable of) the SDK's
    async stream; ``reader`` defaults to :data:`CHAT_READER`."""
    return _SDK.stream(
        _run_stream_async, policy, clients, call, idempotency_key, reader,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt, on_cancel=on_cancel,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens,
        now=now, on_decision=on_decision, on_sleep=on_sleep, on_terminal=on_terminal,
    )


def _chat_call(params: Params) -> Callable[[Any, StreamStep], Any]:
    def call(client: Any, step: StreamStep) -> Any:
        args = _params(params, step)
        options = dict(args.pop("stream_options", None) or {})
        options["include_usage"] = True
        return client.chat.completions.create(**args, stream=True, stream_options=options)

    return call


def _responses_call(params: Params) -> Callable[[Any, StreamStep], Any]:
    def call(client: Any, step: StreamStep) -> Any:
        resume = step.continuation
        if resume is not None:
            return client.responses.retrieve(
                resume["response_id"], stream=True, starting_after=resume["starting_after"]
            )
        return client.responses.create(**_params(params, step), stream=True, background=True)

    return call


def stream_chat_completions(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    params: Params,
    idempotency_key: str,
    **options: Any,
) -> StreamRun:
    """Stream a chat completion: ``client.chat.completions.create(**params,
    stream=True, stream_options={"include_usage": True})`` on each attempt's
    route; ``params`` is a mapping or a function of the step. ``options`` are
    :func:`run_stream`'s. Yields :class:`retryledger.StreamEvent` objects whose
    ``data`` is the SDK's chunk."""
    return run_stream(policy, clients, _chat_call(params), idempotency_key, reader=CHAT_READER, **options)


def stream_chat_completions_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    params: Params,
    idempotency_key: str,
    **options: Any,
) -> AsyncStreamRun:
    """:func:`stream_chat_completions` over ``AsyncOpenAI`` clients."""
    return run_stream_async(policy, clients, _chat_call(params), idempotency_key, reader=CHAT_READER, **options)


def stream_responses(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    params: Params,
    idempotency_key: str,
    **options: Any,
) -> StreamRun:
    """Stream a response of the Responses API: ``client.responses.create(**params,
    stream=True, background=True)``; when the step resumes a response (the
    policy's ``continuation`` mode after a cut), ``client.responses.retrieve(
    response_id, stream=True, starting_after=N)`` instead, so the resumed
    events continue the output. ``options`` are :func:`run_stream`'s."""
    return run_stream(policy, clients, _responses_call(params), idempotency_key, reader=RESPONSES_READER, **options)


def stream_responses_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    params: Params,
    idempotency_key: str,
    **options: Any,
) -> AsyncStreamRun:
    """:func:`stream_responses` over ``AsyncOpenAI`` clients."""
    return run_stream_async(policy, clients, _responses_call(params), idempotency_key, reader=RESPONSES_READER, **options)
