"""Integration with plain ``httpx``: retryledger owns every retry.

``request(client, step)`` makes one request with the client of
``step.route_id`` (or the one client given for every route) and returns the
``httpx.Response``; the driver calls ``response.raise_for_status()``, so a
non-2xx answer becomes ``httpx.HTTPStatusError``, whose
``response.status_code``, ``response.headers`` (``retry-after``,
``retry-after-ms``, the rate-limit headers) and body (at most 16 KiB + 1
byte of it, read here when the request streamed) the core judges by its HTTP
rules and, for a route that names its provider family, its provider tables
(docs/PROVIDERS.md). httpx's transport
errors (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``ReadError``,
``RemoteProtocolError``, ...) are in the core's tables: nothing is mapped
here (docs/HOSTS.md).

Every request sent by ``request`` during an attempt carries the run's
``Idempotency-Key`` and a timeout no longer than the remaining deadline: the
drivers add one request event hook to each client, which does nothing outside
an attempt of these drivers (it reads a context variable). The hook also
records the SHA-256 of each request's body as sent (``step.request_body``),
so a retry that sends another body is ``request_body_drift`` and the
attempts document shows what went out; a streamed body is not recorded.

httpx retries nothing by default; ``httpx.HTTPTransport(retries=N)`` retries
failed connections N times. A client whose transport (or a mounted one) has
``retries`` above 0 is refused with ``PolicyError("retry_owner_not_harness")``
before any request. A custom transport that retries in some other way cannot
be seen from here.

    client = httpx.Client()
    result = retryledger.httpx.run(
        policy, client,
        lambda client, step: client.post(URLS[step.route_id], json=body),
        idempotency_key,
    )
    result.value.json()
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import httpx

from ._api import Document, Policy, _check_route_clients, _policy_of
from ._driver import AttemptCallback, RunCancelledError, RunResult, Step, run as _run, run_async as _run_async
from ._errors import PolicyError
from ._sending import IDEMPOTENCY_HEADER as IDEMPOTENCY_HEADER, hook, sending
from .fleet import Fleet
from .testing import Fault, FakeClock, _Chooser
from ._tables import MAX_ERROR_BODY_BYTES

__all__ = ["IDEMPOTENCY_HEADER", "FaultTransport", "require_no_retries", "run", "run_async"]

C = TypeVar("C", httpx.Client, httpx.AsyncClient)

# (idempotency key, deadline in seconds) of the attempt running in this context.
def _transport_retries(transport: Any) -> int:
    """``retries`` of an ``httpx.HTTPTransport`` / ``AsyncHTTPTransport`` (its httpcore pool's)."""
    retries = getattr(getattr(transport, "_pool", None), "_retries", 0)
    return retries if isinstance(retries, int) else 0


def require_no_retries(client: Union[httpx.Client, httpx.AsyncClient]) -> None:
    """Refuse a client whose transport retries on its own: retries at two layers multiply."""
    transports = [("", getattr(client, "_transport", None))]
    mounts = getattr(client, "_mounts", None) or {}
    transports += [(f" (mounted at {getattr(p, 'pattern', p)!s})", t) for p, t in mounts.items()]
    for where, transport in transports:
        retries = _transport_retries(transport)
        if retries != 0:
            raise PolicyError(
                "retry_owner_not_harness",
                f"the httpx client's transport{where} has retries={retries!r}; "
                "create it with retries=0 (the default) so that retryledger owns every retry",
                "/retries",
            )


def _prepare(policy: Union[Policy, Document], clients: Union[C, Mapping[str, C]]) -> Tuple[Policy, Mapping[str, C]]:
    compiled = _policy_of(policy)
    routes = [r["route_id"] for r in compiled.document["routes"]]
    by_route: Mapping[str, C]
    if isinstance(clients, (httpx.Client, httpx.AsyncClient)):
        by_route = {route: clients for route in routes}
    else:
        by_route = clients
    for client in by_route.values():
        require_no_retries(client)
    _check_route_clients(compiled, by_route, "httpx client")
    for client in by_route.values():
        hook(client)
    return compiled, by_route


def _error_body(response: httpx.Response) -> None:
    """Read at most ``MAX_ERROR_BODY_BYTES + 1`` bytes of an error response
    that is still unread (a streamed request) into ``response``, so the
    driver passes the body to the core (docs/PROVIDERS.md); then close it."""
    try:
        response.content
        return
    except httpx.ResponseNotRead:
        pass
    chunks = []
    size = 0
    try:
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ERROR_BODY_BYTES:
                break
    except httpx.HTTPError:
        return
    finally:
        response.close()
    response._content = b"".join(chunks)[: MAX_ERROR_BODY_BYTES + 1]


async def _error_body_async(response: httpx.Response) -> None:
    """:func:`_error_body` for an async response."""
    try:
        response.content
        return
    except httpx.ResponseNotRead:
        pass
    chunks = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ERROR_BODY_BYTES:
                break
    except httpx.HTTPError:
        return
    finally:
        await response.aclose()
    response._content = b"".join(chunks)[: MAX_ERROR_BODY_BYTES + 1]


def run(
    policy: Union[Policy, Document],
    clients: Union[httpx.Client, Mapping[str, httpx.Client]],
    request: Callable[[httpx.Client, Step], httpx.Response],
    idempotency_key: str,
    *,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    price_schedule: Optional[Document] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    fleet: Optional[Fleet] = None,
    reserve_tokens: Optional[int] = None,
) -> RunResult[httpx.Response]:
    """:func:`retryledger.run` over ``httpx.Client``: one for every route, or one per route id.

    The run's value is the 2xx response ``request`` returned. ``fleet`` and
    ``reserve_tokens`` are :func:`retryledger.run`'s; the rate-limit headers
    of every response go to the fleet's admission release.
    """
    compiled, by_route = _prepare(policy, clients)

    def dispatch(step: Step) -> httpx.Response:
        with sending(step):
            response = request(by_route[step.route_id], step)
        if not response.is_success:
            _error_body(response)
            response.close()
        response.raise_for_status()
        return response

    return _run(
        compiled,
        dispatch,
        idempotency_key,
        clock=clock,
        sleep=sleep,
        wall_clock=wall_clock,
        on_attempt=on_attempt,
        price_schedule=price_schedule,
        key_scope=key_scope,
        fleet=fleet,
        reserve_tokens=reserve_tokens,
    )


async def run_async(
    policy: Union[Policy, Document],
    clients: Union[httpx.AsyncClient, Mapping[str, httpx.AsyncClient]],
    request: Callable[[httpx.AsyncClient, Step], Awaitable[httpx.Response]],
    idempotency_key: str,
    *,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], Awaitable[None]]] = None,
    wall_clock: Optional[Callable[[], float]] = None,
    on_attempt: Optional[AttemptCallback] = None,
    on_cancel: Optional[Callable[[RunCancelledError], None]] = None,
    price_schedule: Optional[Document] = None,
    key_scope: Optional[Tuple[str, str]] = None,
    fleet: Optional[Fleet] = None,
    reserve_tokens: Optional[int] = None,
) -> RunResult[httpx.Response]:
    """:func:`retryledger.run_async` over ``httpx.AsyncClient``: one for every route, or one per route id."""
    compiled, by_route = _prepare(policy, clients)

    async def dispatch(step: Step) -> httpx.Response:
        with sending(step):
            response = await request(by_route[step.route_id], step)
        if not response.is_success:
            await _error_body_async(response)
            await response.aclose()
        response.raise_for_status()
        return response

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
        fleet=fleet,
        reserve_tokens=reserve_tokens,
    )


class FaultTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An ``httpx`` transport (sync and async) with faults injected in front of
    ``inner``: an HTTP fault answers a response with its status and headers
    without sending; a connection fault raises ``httpx.RemoteProtocolError``
    (a reset) or ``httpx.ReadTimeout`` carrying the injected-fault header. Give it to
    ``httpx.Client(transport=...)`` (or an SDK's ``http_client``)."""

    def __init__(
        self,
        inner: Any,
        *,
        script: Sequence[Optional[Fault]] = (),
        rates: Optional[Mapping[str, float]] = None,
        seed: int = 1,
        clock: Optional[FakeClock] = None,
        latency_ms: int = 0,
    ) -> None:
        self._inner = inner
        self._chooser = _Chooser(script, rates or {}, seed, clock, latency_ms)

    @property
    def injected(self) -> int:
        """How many failures were injected so far."""
        return self._chooser.injected

    def _injected(self, request: httpx.Request) -> Optional[httpx.Response]:
        failure = self._chooser.failure(self._chooser.next())
        if failure is None:
            return None
        if failure.status_code is not None:
            return httpx.Response(
                failure.status_code,
                headers={"content-type": "application/json", **failure.headers},
                json={"error": {"message": str(failure), "type": failure.fault["kind"]}},
                request=request,
            )
        error: Exception
        if failure.code == "ETIMEDOUT":
            error = httpx.ReadTimeout(str(failure), request=request)
        else:  # a connection reset after the request went out
            error = httpx.RemoteProtocolError(str(failure), request=request)
        setattr(error, "headers", failure.headers)
        raise error

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._injected(request)
        if answer is not None:
            return answer
        response: httpx.Response = self._inner.handle_request(request)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._injected(request)
        if answer is not None:
            return answer
        response: httpx.Response = await self._inner.handle_async_request(request)
        return response

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __enter__(self) -> "FaultTransport":
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)

    async def __aenter__(self) -> "FaultTransport":
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._inner.__aexit__(*exc)
