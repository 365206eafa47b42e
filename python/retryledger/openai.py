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
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping, Optional, TypeVar, Union

from ._api import Document, Policy
from ._driver import AttemptCallback, RunCancelledError, RunResult, Step, run as _run, run_async as _run_async
from ._errors import PolicyError

__all__ = ["IDEMPOTENCY_HEADER", "require_no_retries", "run", "run_async"]

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
) -> RunResult[T]:
    """:func:`retryledger.run` over openai clients, one per route id."""
    compiled = _prepare(policy, clients)
    return _run(
        compiled,
        lambda step: call(_client_for(clients, step), step),
        idempotency_key,
        clock=clock,
        sleep=sleep,
        wall_clock=wall_clock,
        on_attempt=on_attempt,
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
) -> RunResult[T]:
    """:func:`retryledger.run_async` over ``AsyncOpenAI`` clients, one per route id."""
    compiled = _prepare(policy, clients)
    return await _run_async(
        compiled,
        lambda step: call(_client_for(clients, step), step),
        idempotency_key,
        clock=clock,
        sleep=sleep,
        wall_clock=wall_clock,
        on_attempt=on_attempt,
        on_cancel=on_cancel,
    )
