"""The attempt an outgoing ``httpx`` request belongs to.

The drivers' integrations over ``httpx`` (plain clients, and the ``openai``
and ``anthropic`` SDKs, which send through one) add one request event hook
to each client. While an attempt is being dispatched (:func:`sending`), the
hook stamps every request it sends with the run's ``Idempotency-Key`` and a
timeout no longer than the remaining deadline, and records the SHA-256 of
the body as sent (``step.request_body``); a response hook records the
rate-limit headers of each response (``step.rate_limit_headers``) for the
fleet's admission release. Outside an attempt the hooks do nothing (they
read a context variable).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Dict, Iterator, Optional

import httpx

from ._driver import Step

#: The header that carries the idempotency key on every attempt.
IDEMPOTENCY_HEADER = "Idempotency-Key"

_ATTEMPT: contextvars.ContextVar[Optional[Step]] = contextvars.ContextVar("retryledger_attempt", default=None)


@contextlib.contextmanager
def sending(step: Step) -> Iterator[None]:
    """Requests sent inside belong to ``step``."""
    token = _ATTEMPT.set(step)
    try:
        yield
    finally:
        _ATTEMPT.reset(token)


def _stamp(request: httpx.Request) -> None:
    step = _ATTEMPT.get()
    if step is None:
        return
    seconds = max(step.remaining_ms, 0) / 1000.0
    request.headers[IDEMPOTENCY_HEADER] = step.idempotency_key
    timeouts: Dict[str, Any] = dict(request.extensions.get("timeout") or {})
    for name in ("connect", "read", "write", "pool"):
        given = timeouts.get(name)
        timeouts[name] = seconds if given is None else min(float(given), seconds)
    request.extensions["timeout"] = timeouts
    try:
        body = request.content
    except Exception:  # a streamed body (RequestNotRead): its bytes are not known before sending
        return
    if isinstance(body, bytes):
        step.request_body(body)
        step.check_sent(request.url.path, body)


def _on_request(request: httpx.Request) -> None:
    _stamp(request)


async def _on_request_async(request: httpx.Request) -> None:
    _stamp(request)


def _seen(response: httpx.Response) -> None:
    step = _ATTEMPT.get()
    if step is not None:
        step.rate_limit_headers(response.headers)


def _on_response(response: httpx.Response) -> None:
    _seen(response)


async def _on_response_async(response: httpx.Response) -> None:
    _seen(response)


def hook(client: Any) -> None:
    """Give ``client`` the request hook and the response hook (which records
    the rate-limit headers of every response on the attempt,
    ``step.rate_limit_headers``), once and last. Any client with httpx's
    ``event_hooks`` takes them (the SDKs may ship their own copy of httpx);
    an async one (with ``aclose``) gets the coroutine hooks."""
    is_async = hasattr(client, "aclose")
    on_request: Any = _on_request_async if is_async else _on_request
    on_response: Any = _on_response_async if is_async else _on_response
    hooks = client.event_hooks
    if on_request not in hooks["request"] or on_response not in hooks["response"]:
        client.event_hooks = {
            "request": [*(h for h in hooks["request"] if h is not on_request), on_request],
            "response": [*(h for h in hooks["response"] if h is not on_response), on_response],
        }


def hook_sdk(client: Any) -> None:
    """Give an SDK client's underlying HTTP client the request hook (the
    ``openai`` and ``anthropic`` clients keep it as ``_client`` and share it
    with every ``with_options`` copy); a client without one is left alone."""
    http: Any = getattr(client, "_client", None)
    hooks = getattr(http, "event_hooks", None)
    if isinstance(hooks, dict) and "request" in hooks and "response" in hooks:
        hook(http)
