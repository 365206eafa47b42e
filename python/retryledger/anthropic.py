"""Integration with the ``anthropic`` package: retryledger owns every retry.

The SDK retries on its own (``max_retries`` defaults to 2: 408, 409, 429, every
5xx including 529 ``overloaded_error``, and connection errors), so under a
harness that also retries, one logical call becomes up to 3 x 3 requests.
These drivers refuse any client whose ``max_retries`` is not 0, send the same
``Idempotency-Key`` on every attempt and pass the remaining deadline as the
request timeout.

The SDK's exceptions need no mapping here: the drivers pass their facts
(class names along the cause chain, ``status_code``, ``response.headers``) to
the core, whose tables know the SDK's error classes (``APIConnectionError``,
``APITimeoutError``, ``APIResponseValidationError``, the same names as
openai's) and whose HTTP rules judge every status, 529 included
(docs/HOSTS.md). The drivers also pass the body (``response.text``) and the
``anthropic-ratelimit-*`` headers: for a route that names its provider family
(``anthropic``) the core's provider table reads the body's ``error.type`` and
a reset whose remaining count is 0 gives the wait (docs/PROVIDERS.md).

    clients = {"primary": Anthropic(max_retries=0, ...), "fallback": Anthropic(max_retries=0, ...)}
    result = retryledger.anthropic.run(
        policy, clients,
        lambda client, step: client.messages.create(model=..., max_tokens=..., messages=...),
        idempotency_key,
    )

Streams: :func:`stream_messages` (``messages.create(stream=True)``) and
:func:`stream_messages_async` run :func:`retryledger.run_stream` under the
policy's stream contract (:data:`MESSAGES_READER` reads the events);
:func:`run_stream` takes any ``call(client, step)``. Each attempt's client
carries the Idempotency-Key and the stream's read timeout.

For a policy with a ``fleet`` section every function takes ``fleet=`` (a
:class:`retryledger.fleet.Fleet`): each attempt is admitted against the
fleet's breakers and retry budget first, its outcome recorded after.

Usage is charged automatically when the run has a price schedule
(``price_schedule=``, checked against the policy before the first dispatch)
and the value ``call`` returns carries ``usage`` (return the SDK's
``Message``, or anything with its ``usage``). The units, with only nonzero
counts charged:

* ``input``: ``usage.input_tokens`` (the API counts cache reads and writes apart)
* ``cached_input``: ``usage.cache_read_input_tokens``
* ``output``: ``usage.output_tokens``
* ``cache_creation_input``: ``usage.cache_creation_input_tokens``

Cache writes are charged as their own unit, so a schedule that does not
price ``cache_creation_input`` refuses a response that wrote the cache
rather than leaving those tokens uncharged. An attempt whose value carries
no usage (a stream, a value ``call`` built itself) keeps its reservation
unless ``call`` reports it with ``step.usage(...)`` (:func:`usage_units` maps
an SDK usage object). Usage the schedule does not price raises the core's
coded error (``usage_unpriced``) out of the attempt, which ends the run as
an unrecognized error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from .checks import OutputCheck, answer_checks as _answer_checks, anthropic_parts
from ._api import Document, Policy
from ._driver import AttemptCallback, DecisionCallback, RunCancelledError, RunResult, SleepCallback, Step, TerminalCallback
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

if TYPE_CHECKING:
    from anthropic import Anthropic, AsyncAnthropic

__all__ = [
    "IDEMPOTENCY_HEADER",
    "require_no_retries",
    "run",
    "run_async",
    "usage_units",
    "answer_checks",
    "run_stream",
    "run_stream_async",
    "stream_messages",
    "stream_messages_async",
    "MessagesReader",
    "MESSAGES_READER",
]

T = TypeVar("T")


def answer_checks(*, json: bool = False, validators: Sequence[OutputCheck] = ()) -> List[OutputCheck]:
    """The built-in output checks of anthropic answers, for ``checks=``
    (docs/REPAIR.md): ``refusal`` (policy_denied: never a fallback),
    ``truncated``, ``empty``, with ``json=True`` ``unparsable_json`` (a JSON
    output was asked for), then ``validators`` (:mod:`retryledger.checks`)
    run on the answer's text."""
    return _answer_checks("anthropic", anthropic_parts, json, validators)


def require_no_retries(client: Union[Anthropic, AsyncAnthropic]) -> None:
    """Refuse a client that retries on its own: retries at two layers multiply."""
    require_max_retries_zero(client, "anthropic")


#: Price unit -> the field of the SDK's ``Usage``.
_UNITS = (
    ("input", "input_tokens"),
    ("cached_input", "cache_read_input_tokens"),
    ("output", "output_tokens"),
    ("cache_creation_input", "cache_creation_input_tokens"),
)


def usage_units(response: Any) -> Optional[Dict[str, Any]]:
    """The price units of a message's ``usage`` (the SDK object or its dict
    form; a bare usage object is accepted too), only the nonzero ones;
    ``None`` when it carries no usage. See the module's table."""
    usage = _field(response, "usage")
    if usage is None:
        usage = response
    if _field(usage, "input_tokens") is None and _field(usage, "output_tokens") is None:
        return None
    units = {kind: _field(usage, name) for kind, name in _UNITS}
    return {kind: count for kind, count in units.items() if count is not None and count != 0}


def run(
    policy: Union[Policy, Document],
    clients: Mapping[str, Anthropic],
    call: Callable[[Anthropic, Step], T],
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
    """:func:`retryledger.run` over ``Anthropic`` clients, one per route id.

    ``call(client, step)`` makes one request (``client.messages.create(...)``)
    with the client of ``step.route_id``, already carrying the idempotency key
    and the remaining deadline as its timeout. With ``price_schedule`` the
    usage of each returned message is charged.
    """
    return _SDK.run(
        policy, clients, call, idempotency_key,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens, **options,
    )


async def run_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, AsyncAnthropic],
    call: Callable[[AsyncAnthropic, Step], Awaitable[T]],
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
    """:func:`retryledger.run_async` over ``AsyncAnthropic`` clients, one per
    route id; with ``price_schedule`` the usage of each returned message is charged."""
    return await _SDK.run_async(
        policy, clients, call, idempotency_key,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt, on_cancel=on_cancel,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens, **options,
    )


# ---- streams ------------------------------------------------------------------

class MessagesReader:
    """Message stream events (``messages.create(stream=True)``): the text of
    ``content_block_delta`` events with a ``text_delta``, the message id of
    ``message_start``, ``message_stop`` as the terminal event, and the usage
    of ``message_start`` and ``message_delta`` (the later counts replace the
    earlier ones: ``message_delta`` carries the final output tokens). No
    sequence numbers: a message stream is never resumed."""

    def text(self, event: Any) -> str:
        if _get(event, "type") != "content_block_delta":
            return ""
        delta = _get(event, "delta")
        if _get(delta, "type") != "text_delta":
            return ""
        text = _get(delta, "text")
        return text if isinstance(text, str) else ""

    def sequence(self, event: Any) -> Optional[int]:
        return None

    def response_id(self, event: Any) -> Optional[str]:
        if _get(event, "type") != "message_start":
            return None
        ident = _get(_get(event, "message"), "id")
        return ident if isinstance(ident, str) and ident else None

    def is_terminal(self, event: Any) -> bool:
        return bool(_get(event, "type") == "message_stop")

    def usage(self, event: Any) -> Optional[Mapping[str, Any]]:
        kind = _get(event, "type")
        if kind == "message_start":
            return usage_units(_get(event, "message"))
        if kind == "message_delta" and _get(event, "usage") is not None:
            return usage_units(event)
        return None


MESSAGES_READER = MessagesReader()

_SDK = _Sdk("anthropic", usage_units, MESSAGES_READER, {"max_retries": 0})


def run_stream(
    policy: Union[Policy, Document],
    clients: Mapping[str, Anthropic],
    call: Callable[[Anthropic, StreamStep], Any],
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
    """:func:`retryledger.run_stream` over ``Anthropic`` clients, one per route
    id: ``call(client, step)`` opens the stream with the route's client
    (carrying the idempotency key and the stream's read timeout); ``reader``
    defaults to :data:`MESSAGES_READER`."""
    return _SDK.stream(
        _run_stream, policy, clients, call, idempotency_key, reader,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens,
        now=now, on_decision=on_decision, on_sleep=on_sleep, on_terminal=on_terminal,
    )


def run_stream_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, AsyncAnthropic],
    call: Callable[[AsyncAnthropic, StreamStep], Any],
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
    """:func:`retryledger.run_stream_async` over ``AsyncAnthropic`` clients."""
    return _SDK.stream(
        _run_stream_async, policy, clients, call, idempotency_key, reader,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt, on_cancel=on_cancel,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens,
        now=now, on_decision=on_decision, on_sleep=on_sleep, on_terminal=on_terminal,
    )


def _messages_call(params: Params) -> Callable[[Any, StreamStep], Any]:
    def call(client: Any, step: StreamStep) -> Any:
        return client.messages.create(**_params(params, step), stream=True)

    return call


def stream_messages(
    policy: Union[Policy, Document],
    clients: Mapping[str, Anthropic],
    params: Params,
    idempotency_key: str,
    **options: Any,
) -> StreamRun:
    """Stream a message: ``client.messages.create(**params, stream=True)`` on
    each attempt's route; ``params`` is a mapping or a function of the step.
    ``options`` are :func:`run_stream`'s. Yields
    :class:`retryledger.StreamEvent` objects whose ``data`` is the SDK's event."""
    return run_stream(policy, clients, _messages_call(params), idempotency_key, reader=MESSAGES_READER, **options)


def stream_messages_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, AsyncAnthropic],
    params: Params,
    idempotency_key: str,
    **options: Any,
) -> AsyncStreamRun:
    """:func:`stream_messages` over ``AsyncAnthropic`` clients."""
    return run_stream_async(policy, clients, _messages_call(params), idempotency_key, reader=MESSAGES_READER, **options)
