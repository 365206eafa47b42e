"""Integration with the ``openai`` package: retryledger owns every retry.

The SDK retries on its own (``max_retries`` defaults to 2), so under a harness
that also retries, one logical call becomes up to 3 x 3 requests. These
drivers refuse any client whose ``max_retries`` is not 0, send the same
``Idempotency-Key`` on every attempt, pass the remaining deadline as the
request timeout, and map the SDK's exceptions to outcomes:

* ``RateLimitError`` (429): retryable ``rate_limited`` with the server's
  ``retry-after-ms`` or ``retry-after`` hint (the core bounds it);
* ``InternalServerError`` and other 5xx: retryable ``unavailable`` (501 and
  505 are invalid requests);
* ``APITimeoutError``: retryable ``timeout_before_response``;
* ``APIConnectionError``: retryable ``unavailable`` when no connection was
  made, otherwise indeterminate ``unknown_provider_acceptance`` (the request
  may have been accepted, so it is never resent);
* the 4xx kinds: ``BadRequestError``, ``NotFoundError``,
  ``UnprocessableEntityError`` -> ``invalid_request``; ``PermissionDeniedError``
  -> ``policy_denied``; ``AuthenticationError``, ``ConflictError`` and the
  rest -> ``rejected`` (none retried);
* ``APIResponseValidationError``: non-retryable ``protocol_violation``.

    clients = {"primary": OpenAI(max_retries=0, ...), "fallback": OpenAI(max_retries=0, ...)}
    result = retryledger.openai.run(
        policy, clients,
        lambda client, step: client.chat.completions.create(model=..., messages=...),
        idempotency_key,
    )
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping, Optional, TypeVar, Union

import openai as _openai

from ._api import Document, Policy
from ._driver import RunCancelledError, RunResult, Step, http_outcome, run as _run, run_async as _run_async
from ._errors import PolicyError

__all__ = ["IDEMPOTENCY_HEADER", "classify", "require_no_retries", "run", "run_async"]

T = TypeVar("T")

#: The header that carries the idempotency key on every attempt.
IDEMPOTENCY_HEADER = "Idempotency-Key"

_TIMEOUT = '{"class":"retryable","kind":"timeout_before_response"}'
_UNAVAILABLE = '{"class":"retryable","kind":"unavailable"}'
_UNKNOWN = '{"class":"indeterminate","kind":"unknown_provider_acceptance"}'
_PROTOCOL = '{"class":"non_retryable","kind":"protocol_violation"}'


def _connect_failed(exc: BaseException) -> bool:
    """Whether the transport failed before any connection was made (nothing was sent)."""
    cause = exc.__cause__
    return cause is not None and any(c.__name__ == "ConnectError" for c in type(cause).__mro__)


def classify(exc: BaseException) -> Optional[str]:
    """The outcome (JSON text) of an exception the openai package raised, or ``None``."""
    if isinstance(exc, _openai.APIResponseValidationError):
        return _PROTOCOL
    if isinstance(exc, _openai.APITimeoutError):
        return _TIMEOUT
    if isinstance(exc, _openai.APIConnectionError):
        return _UNAVAILABLE if _connect_failed(exc) else _UNKNOWN
    if isinstance(exc, _openai.APIStatusError):
        return http_outcome(exc)
    return None


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
) -> RunResult[T]:
    """:func:`retryledger.run` over openai clients, one per route id."""
    compiled = _prepare(policy, clients)
    return _run(
        compiled,
        lambda step: call(_client_for(clients, step), step),
        idempotency_key,
        classify=classify,
        clock=clock,
        sleep=sleep,
    )


async def run_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    call: Callable[[Any, Step], Awaitable[T]],
    idempotency_key: str,
    *,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    on_cancel: Optional[Callable[[RunCancelledError], None]] = None,
) -> RunResult[T]:
    """:func:`retryledger.run_async` over ``AsyncOpenAI`` clients, one per route id."""
    compiled = _prepare(policy, clients)
    return await _run_async(
        compiled,
        lambda step: call(_client_for(clients, step), step),
        idempotency_key,
        classify=classify,
        clock=clock,
        sleep=sleep,
        on_cancel=on_cancel,
    )
