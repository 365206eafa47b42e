"""Integration with the ``openai`` package: retryledger owns every retry.

The SDK retries on its own (``max_retries`` defaults to 2), so under a harness
that also retries, one logical call becomes up to 3 x 3 requests. These
drivers refuse any client whose ``max_retries`` is not 0, send the same
``Idempotency-Key`` on every attempt and pass the remaining deadline as the
request timeout. The SDK's exceptions need no mapping here: the drivers pass
their facts (class names along the cause chain, ``status_code``,
``response.headers``) to the core, whose tables know the SDK's error classes
(``APIConnectionError``, ``APITimeoutError``, ``APIResponseValidationError``,
httpx's ``ConnectError``, ...) and whose HTTP rules judge every status
(docs/HOSTS.md).

    clients = {"primary": OpenAI(max_retries=0, ...), "fallback": OpenAI(max_retries=0, ...)}
    result = retryledger.openai.run(
        policy, clients,
        lambda client, step: client.chat.completions.create(model=..., messages=...),
        idempotency_key,
    )

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

from typing import Any, Awaitable, Callable, Dict, Mapping, Optional, Tuple, TypeVar, Union

from ._api import Document, Policy
from ._driver import AttemptCallback, RunCancelledError, RunResult, Step, run as _run, run_async as _run_async
from ._errors import PolicyError

__all__ = ["IDEMPOTENCY_HEADER", "require_no_retries", "run", "run_async", "usage_units"]

T = TypeVar("T")

#: The header that carries the idempotency key on every attempt.
IDEMPOTENCY_HEADER = "Idempotency-Key"


def require_no_retries(client: Any) -> None:
    """Refuse a client that retries on its own: retries at two layers multiply."""
    retries = getattr(client, "max_retries", None)
    if retries != 0 or isinstance(retries, bool):
        raise PolicyError(
            "retry_owner_not_harness",
            f"the openai client has max_retries={retries!r}; "
            "create it with max_retries=0 so that retryledger owns every retry",
            "/max_retries",
        )


def _field(holder: Any, name: str) -> Any:
    """``holder[name]`` of a mapping, else the attribute; ``None`` when absent."""
    if holder is None:
        return None
    if isinstance(holder, Mapping):
        return holder.get(name)
    return getattr(holder, name, None)


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


def _charged(step: Step, value: T) -> T:
    """Charge the usage ``value`` carries when the run has a price schedule."""
    if step.price_schedule is not None:
        units = usage_units(value)
        if units is not None:
            step.usage(units)
    return value


def _prepare(policy: Union[Policy, Document], clients: Mapping[str, Any]) -> Policy:
    compiled = policy if isinstance(policy, Policy) else Policy(policy)
    for client in clients.values():
        require_no_retries(client)
    missing = [r["route_id"] for r in compiled.document["routes"] if r["route_id"] not in clients]
    if missing:
        raise KeyError(f"no openai client for route(s) {', '.join(missing)}")
    return compiled


def _client_for(clients: Mapping[str, Any], step: Step) -> Any:
    return clients[step.route_id].with_options(
        timeout=step.remaining_ms / 1000.0,
        default_headers={IDEMPOTENCY_HEADER: step.idempotency_key},
    )


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
    key_scope: Optional[Tuple[str, str]] = None,
) -> RunResult[T]:
    """:func:`retryledger.run` over openai clients, one per route id; with
    ``price_schedule`` the usage of each returned response is charged."""
    compiled = _prepare(policy, clients)
    return _run(
        compiled,
        lambda step: _charged(step, call(_client_for(clients, step), step)),
        idempotency_key,
        clock=clock,
        sleep=sleep,
        wall_clock=wall_clock,
        on_attempt=on_attempt,
        price_schedule=price_schedule,
        key_scope=key_scope,
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
    key_scope: Optional[Tuple[str, str]] = None,
) -> RunResult[T]:
    """:func:`retryledger.run_async` over ``AsyncOpenAI`` clients, one per route
    id; with ``price_schedule`` the usage of each returned response is charged."""
    compiled = _prepare(policy, clients)

    async def dispatch(step: Step) -> T:
        return _charged(step, await call(_client_for(clients, step), step))

    return await _run_async(
        compiled,
        dispatch,
        idempotency_key,
        clock=clock,
        sleep=sleep,
        wall_clock=wall_clock,
        on_attempt=on_attempt,
        on_cancel=on_cancel,
        price_schedule=price_schedule,
        key_scope=key_scope,
    )
