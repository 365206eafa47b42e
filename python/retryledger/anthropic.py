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
(docs/HOSTS.md). Of the response headers the core reads ``retry-after`` and
``retry-after-ms``; the ``anthropic-ratelimit-*`` headers are not read.

    clients = {"primary": Anthropic(max_retries=0, ...), "fallback": Anthropic(max_retries=0, ...)}
    result = retryledger.anthropic.run(
        policy, clients,
        lambda client, step: client.messages.create(model=..., max_tokens=..., messages=...),
        idempotency_key,
    )
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Awaitable, Callable, Mapping, Optional, TypeVar, Union

from ._api import Document, Policy
from ._driver import AttemptCallback, RunCancelledError, RunResult, Step, run as _run, run_async as _run_async
from ._errors import PolicyError

if TYPE_CHECKING:
    from anthropic import Anthropic, AsyncAnthropic

__all__ = ["IDEMPOTENCY_HEADER", "require_no_retries", "run", "run_async"]

T = TypeVar("T")
C = TypeVar("C", "Anthropic", "AsyncAnthropic")

#: The header that carries the idempotency key on every attempt.
IDEMPOTENCY_HEADER = "Idempotency-Key"


def require_no_retries(client: Union[Anthropic, AsyncAnthropic]) -> None:
    """Refuse a client that retries on its own: retries at two layers multiply."""
    retries = getattr(client, "max_retries", None)
    if retries != 0 or isinstance(retries, bool):
        raise PolicyError(
            "retry_owner_not_harness",
            f"the anthropic client has max_retries={retries!r}; "
            "create it with max_retries=0 so that retryledger owns every retry",
            "/max_retries",
        )


def _prepare(policy: Union[Policy, Document], clients: Mapping[str, C]) -> Policy:
    compiled = policy if isinstance(policy, Policy) else Policy(policy)
    for client in clients.values():
        require_no_retries(client)
    missing = [r["route_id"] for r in compiled.document["routes"] if r["route_id"] not in clients]
    if missing:
        raise KeyError(f"no anthropic client for route(s) {', '.join(missing)}")
    return compiled


def _client_for(clients: Mapping[str, C], step: Step) -> C:
    return clients[step.route_id].with_options(
        timeout=step.remaining_ms / 1000.0,
        max_retries=0,
        default_headers={IDEMPOTENCY_HEADER: step.idempotency_key},
    )


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
) -> RunResult[T]:
    """:func:`retryledger.run` over ``Anthropic`` clients, one per route id.

    ``call(client, step)`` makes one request (``client.messages.create(...)``)
    with the client of ``step.route_id``, already carrying the idempotency key
    and the remaining deadline as its timeout.
    """
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
    clients: Mapping[str, AsyncAnthropic],
    call: Callable[[AsyncAnthropic, Step], Awaitable[T]],
    idempotency_key: str,
    *,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_cancel: Optional[Callable[[RunCancelledError], None]] = None,
) -> RunResult[T]:
    """:func:`retryledger.run_async` over ``AsyncAnthropic`` clients, one per route id."""
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
