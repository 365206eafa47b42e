"""Integration with the ``google-genai`` package: retryledger owns every retry.

A ``google.genai.Client`` retries when it is built with
``http_options=HttpOptions(retry_options=HttpRetryOptions(...))`` (up to
``attempts`` requests per call, 5 when ``attempts`` is unset), so under a
harness that also retries one logical call multiplies. These drivers refuse
a client whose retry options allow more than one attempt, and give each
attempt ``options``, an ``HttpOptions`` carrying the run's ``Idempotency-Key``
header and the remaining deadline as its ``timeout`` (ms): pass it as the
call's ``config`` ``http_options`` (without ``retry_options``).

The SDK's errors need no mapping here: ``ClientError`` / ``ServerError``
carry the status (``response.status_code``) and the read response, whose
body the drivers pass to the core with the other facts (docs/HOSTS.md). For
a route that names its provider family ``google``, the core's provider table
reads Gemini's error envelope (docs/PROVIDERS.md): a per-day
``RESOURCE_EXHAUSTED`` QuotaFailure is ``quota_exhausted`` (the run stops), a
per-minute one is rate limited and waits the body's ``RetryInfo``
``retryDelay``.

    clients = {"primary": genai.Client(api_key=...), "fallback": genai.Client(api_key=...)}
    result = retryledger.google_genai.run(
        policy, clients,
        lambda client, options, step: client.models.generate_content(
            model="gemini-2.0-flash", contents="...",
            config=types.GenerateContentConfig(http_options=options),
        ),
        idempotency_key,
    )
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, Mapping, Optional, Tuple, TypeVar, Union

from google.genai import types as _types

from ._api import Document, Policy, _check_route_clients, _policy_of
from ._driver import AttemptCallback, RunCancelledError, RunResult, Step, run as _run, run_async as _run_async
from ._errors import PolicyError
from ._integration import IDEMPOTENCY_HEADER as IDEMPOTENCY_HEADER, report_tokens
from .fleet import Fleet

__all__ = [
    "IDEMPOTENCY_HEADER",
    "GENERATE_CONTENT_READER",
    "GenerateContentReader",
    "http_options",
    "require_no_retries",
    "run",
    "run_async",
    "usage_units",
]

T = TypeVar("T")


def require_no_retries(client: Any) -> None:
    """Refuse a client that retries on its own: retries at two layers multiply.

    A client whose ``HttpOptions.retry_options`` allow more than one attempt
    (``attempts`` unset means the SDK's default of 5), or whose options cannot
    be read, is refused with ``PolicyError("retry_owner_not_harness")``."""
    api_client = getattr(client, "_api_client", None)
    options = getattr(api_client, "_http_options", None)
    if not isinstance(options, _types.HttpOptions):
        raise PolicyError(
            "retry_owner_not_harness",
            "not a google.genai Client whose retry options can be read; "
            "pass a google.genai.Client built without retry_options",
            "/retry_options",
        )
    retry = options.retry_options
    if retry is None:
        return
    attempts = retry.attempts
    if attempts is not None and attempts <= 1:
        return
    raise PolicyError(
        "retry_owner_not_harness",
        f"the google-genai client retries (retry_options.attempts={attempts!r}); "
        "build it without retry_options (or attempts=1) so that retryledger owns every retry",
        "/retry_options",
    )


def http_options(step: Step) -> _types.HttpOptions:
    """The options of one attempt: the ``Idempotency-Key`` header and the
    remaining deadline as the request timeout (ms, at least 1)."""
    return _types.HttpOptions(
        headers={IDEMPOTENCY_HEADER: step.idempotency_key},
        timeout=max(1, step.remaining_ms),
    )


def usage_tokens(response: Any) -> Optional[Dict[str, Any]]:
    """The tokens a ``GenerateContentResponse``'s ``usage_metadata`` reports
    (``total_token_count``; the SDK object or its dict form) as
    ``{"total": n}``; ``None`` without usage."""
    usage = response.get("usage_metadata") if isinstance(response, dict) else getattr(response, "usage_metadata", None)
    if usage is None:
        return None
    total = usage.get("total_token_count") if isinstance(usage, dict) else getattr(usage, "total_token_count", None)
    if not isinstance(total, int) or isinstance(total, bool):
        return None
    return {"total": total}


def _count(holder: Any, name: str) -> Optional[int]:
    value = holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_units(response: Any) -> Optional[Dict[str, Any]]:
    """The price units of a ``GenerateContentResponse``'s ``usage_metadata``
    (the SDK object or its dict form), only the nonzero ones: ``input``
    (``prompt_token_count`` - ``cached_content_token_count``),
    ``cached_input``, ``output`` (``candidates_token_count``) and
    ``reasoning`` (``thoughts_token_count``); ``None`` without usage (no
    metadata, or neither a prompt nor a candidates count)."""
    usage = response.get("usage_metadata") if isinstance(response, dict) else getattr(response, "usage_metadata", None)
    if usage is None:
        return None
    prompt = _count(usage, "prompt_token_count")
    made = _count(usage, "candidates_token_count")
    if prompt is None and made is None:
        return None
    cached = _count(usage, "cached_content_token_count") or 0
    units = {
        "input": (prompt or 0) - cached,
        "cached_input": cached,
        "output": made or 0,
        "reasoning": _count(usage, "thoughts_token_count") or 0,
    }
    return {kind: n for kind, n in units.items() if n != 0}


class GenerateContentReader:
    """``generate_content_stream`` chunks (``GenerateContentResponse``): the
    text of the first candidate's text parts (thoughts excluded), the
    ``response_id``, a chunk whose first candidate has a ``finish_reason``
    as the terminal event, and ``usage_metadata`` as usage (the last chunk
    carries the final counts). No sequence numbers: never resumed."""

    def text(self, event: Any) -> str:
        candidates = getattr(event, "candidates", None)
        if not candidates:
            return ""
        content = getattr(candidates[0], "content", None)
        parts = getattr(content, "parts", None) or ()
        return "".join(p.text for p in parts if isinstance(getattr(p, "text", None), str) and not getattr(p, "thought", False))

    def sequence(self, event: Any) -> Optional[int]:
        return None

    def response_id(self, event: Any) -> Optional[str]:
        ident = getattr(event, "response_id", None)
        return ident if isinstance(ident, str) and ident else None

    def is_terminal(self, event: Any) -> bool:
        candidates: Any = getattr(event, "candidates", None)
        return bool(candidates) and getattr(candidates[0], "finish_reason", None) is not None

    def usage(self, event: Any) -> Optional[Mapping[str, Any]]:
        return usage_units(event)


GENERATE_CONTENT_READER = GenerateContentReader()


def _prepare(policy: Union[Policy, Document], clients: Mapping[str, Any]) -> Policy:
    compiled = _policy_of(policy)
    for client in clients.values():
        require_no_retries(client)
    _check_route_clients(compiled, clients, "google-genai client")
    return compiled


def run(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    call: Callable[[Any, _types.HttpOptions, Step], T],
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
) -> RunResult[T]:
    """:func:`retryledger.run` over ``google.genai.Client``s, one per route id:
    ``call(client, options, step)`` with the attempt's :func:`http_options`."""
    compiled = _prepare(policy, clients)

    def dispatch(step: Step) -> T:
        value = call(clients[step.route_id], http_options(step), step)
        report_tokens(step, value, usage_tokens)
        return value

    return _run(
        compiled, dispatch, idempotency_key,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens,
    )


async def run_async(
    policy: Union[Policy, Document],
    clients: Mapping[str, Any],
    call: Callable[[Any, _types.HttpOptions, Step], Awaitable[T]],
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
) -> RunResult[T]:
    """:func:`retryledger.run_async` over ``google.genai.Client``s (their
    ``aio`` side): ``call(client, options, step)`` awaited."""
    compiled = _prepare(policy, clients)

    async def dispatch(step: Step) -> T:
        value = await call(clients[step.route_id], http_options(step), step)
        report_tokens(step, value, usage_tokens)
        return value

    return await _run_async(
        compiled, dispatch, idempotency_key,
        clock=clock, sleep=sleep, wall_clock=wall_clock, on_attempt=on_attempt, on_cancel=on_cancel,
        price_schedule=price_schedule, fleet=fleet, key_scope=key_scope, reserve_tokens=reserve_tokens,
    )
