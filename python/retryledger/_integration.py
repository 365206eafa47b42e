"""What the SDK integrations (``openai``, ``anthropic``) share: the client
checks, the per-attempt client, the usage charge and the drivers they host.

An :class:`_Sdk` holds the provider-specific parts (the SDK's name, its usage
mapping, its default stream reader, the options each attempt's client gets);
each integration's public functions keep their own signatures and docstrings
and pass their keyword options through to it.
"""

from __future__ import annotations

import inspect

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, Mapping, Optional, TypeVar, Union

from ._api import Document, Policy, _check_route_clients, _policy_of
from ._driver import RunResult, Step, run as _run, run_async as _run_async
from ._errors import PolicyError
from ._stream import StreamReader, StreamStep

T = TypeVar("T")
R = TypeVar("R")

from ._sending import IDEMPOTENCY_HEADER as IDEMPOTENCY_HEADER, hook_sdk, sending

if TYPE_CHECKING:
    from .hedge import HedgeAttempt, HedgeRun

#: Parameters of a request: a mapping, or a function of the step (a model per route).
Params = Union[Mapping[str, Any], Callable[[StreamStep], Mapping[str, Any]]]


async def _sent_by(step: Step, opened: Awaitable[Any]) -> Any:
    """Await ``opened`` (an async SDK call, which sends when awaited) as part of ``step``."""
    with sending(step):
        return await opened


def params_for(params: Params, step: StreamStep) -> Dict[str, Any]:
    """The request's parameters for ``step``, as a fresh dict."""
    return dict(params(step) if callable(params) else params)


def field(holder: Any, name: str) -> Any:
    """``holder[name]`` of a mapping, else the attribute; ``None`` when absent."""
    if holder is None:
        return None
    if isinstance(holder, Mapping):
        return holder.get(name)
    return getattr(holder, name, None)


def get(holder: Any, name: str) -> Any:
    """``field`` for the readers' hot path: a dict's item, else the attribute."""
    if type(holder) is dict:
        return holder.get(name)
    return getattr(holder, name, None)


def report_tokens(
    step: Step,
    value: Any,
    usage_units: Callable[[Any], Optional[Dict[str, Any]]],
    units: Optional[Dict[str, Any]] = None,
) -> None:
    """Report the tokens a returned value's usage says (the sum of its price
    units: input, cached input, output, reasoning) with ``step.tokens_used``;
    a value without readable usage reports nothing (the reservation stands)."""
    if units is None:
        try:
            units = usage_units(value)
        except Exception:
            return
    if units:
        total = sum(v for v in units.values() if isinstance(v, int) and not isinstance(v, bool) and v > 0)
        step.tokens_used(total)


def require_max_retries_zero(client: Any, sdk: str) -> None:
    """Refuse an SDK client whose ``max_retries`` is not 0: retries at two layers multiply."""
    retries = getattr(client, "max_retries", None)
    if retries != 0 or isinstance(retries, bool):
        raise PolicyError(
            "retry_owner_not_harness",
            f"the {sdk} client has max_retries={retries!r}; "
            "create it with max_retries=0 so that retryledger owns every retry",
            "/max_retries",
        )


class _Sdk:
    """The provider-specific parts of an SDK integration and the drivers over them.

    ``name``: the SDK's name in errors; ``usage_units``: the price units of
    a returned value (``None`` without usage); ``reader``: the default stream
    reader; ``client_options``: what each attempt's client gets besides its
    timeout and the idempotency header (``with_options``)."""

    __slots__ = ("name", "usage_units", "reader", "client_options")

    def __init__(
        self,
        name: str,
        usage_units: Callable[[Any], Optional[Dict[str, Any]]],
        reader: StreamReader[Any],
        client_options: Mapping[str, Any],
    ) -> None:
        self.name = name
        self.usage_units = usage_units
        self.reader = reader
        self.client_options = dict(client_options)

    def prepare(self, policy: Union[Policy, Document], clients: Mapping[str, Any]) -> Policy:
        """The compiled policy, after every client is checked and every route has one."""
        compiled = _policy_of(policy)
        for client in clients.values():
            require_max_retries_zero(client, self.name)
        for client in clients.values():
            hook_sdk(client)
        _check_route_clients(compiled, clients, f"{self.name} client")
        return compiled

    def client(self, clients: Mapping[str, Any], step: Step, timeout: float) -> Any:
        """The route's client for one attempt: ``timeout`` seconds and the idempotency key."""
        return clients[step.route_id].with_options(
            timeout=timeout,
            **self.client_options,
            default_headers={IDEMPOTENCY_HEADER: step.idempotency_key},
        )

    def charged(self, step: Step, value: T) -> T:
        """Charge the usage ``value`` carries when the run has a price schedule,
        and report its tokens (``step.tokens_used``: the sum of its units) so
        that the admission release settles the attempt's token reservation."""
        units = None
        if step.price_schedule is not None:
            units = self.usage_units(value)
            if units is not None:
                step.usage(units)
        report_tokens(step, value, self.usage_units, units)
        return value

    def run(
        self,
        policy: Union[Policy, Document],
        clients: Mapping[str, Any],
        call: Callable[[Any, Step], T],
        idempotency_key: str,
        **options: Any,
    ) -> RunResult[T]:
        """:func:`retryledger.run` with ``call(client, step)`` on the route's client."""
        compiled = self.prepare(policy, clients)

        def dispatch(step: Step) -> T:
            with sending(step):
                value = call(self.client(clients, step, step.remaining_ms / 1000.0), step)
            return self.charged(step, value)

        return _run(compiled, dispatch, idempotency_key, **options)

    async def run_async(
        self,
        policy: Union[Policy, Document],
        clients: Mapping[str, Any],
        call: Callable[[Any, Step], Awaitable[T]],
        idempotency_key: str,
        **options: Any,
    ) -> RunResult[T]:
        """:func:`retryledger.run_async` with ``call(client, step)`` awaited on the route's client."""
        compiled = self.prepare(policy, clients)

        async def dispatch(step: Step) -> T:
            with sending(step):
                value = await call(self.client(clients, step, step.remaining_ms / 1000.0), step)
            return self.charged(step, value)

        return await _run_async(compiled, dispatch, idempotency_key, **options)

    async def run_hedged_async(
        self,
        policy: Union[Policy, Document],
        clients: Mapping[str, Any],
        call: Callable[[Any, "HedgeAttempt"], Awaitable[T]],
        idempotency_key: str,
        **options: Any,
    ) -> "HedgeRun[T]":
        """:func:`retryledger.hedge.run_hedged_async` with ``call(client,
        attempt)`` awaited on the route's client (the remaining deadline as its
        timeout, the idempotency header); a loser's task is cancelled."""
        from .hedge import run_hedged_async

        compiled = self.prepare(policy, clients)

        async def dispatch(a: "HedgeAttempt") -> T:
            client = clients[a.route_id].with_options(
                timeout=max(a.remaining_ms, 1) / 1000.0,
                **self.client_options,
                default_headers={IDEMPOTENCY_HEADER: a.idempotency_key},
            )
            return await call(client, a)

        return await run_hedged_async(compiled, dispatch, idempotency_key, **options)

    def stream(
        self,
        driver: Callable[..., R],
        policy: Union[Policy, Document],
        clients: Mapping[str, Any],
        call: Callable[[Any, StreamStep], Any],
        idempotency_key: str,
        reader: Optional[StreamReader[Any]],
        **options: Any,
    ) -> R:
        """``driver`` (:func:`retryledger.run_stream` or its async twin) with
        ``call(client, step)`` on the route's client, which carries the
        stream's read timeout; ``reader`` defaults to the SDK's."""
        compiled = self.prepare(policy, clients)
        def open_stream(step: StreamStep) -> Any:
            with sending(step):
                opened = call(self.client(clients, step, step.timeout_s), step)
            return _sent_by(step, opened) if inspect.isawaitable(opened) else opened

        return driver(
            compiled,
            open_stream,
            idempotency_key,
            reader=self.reader if reader is None else reader,
            **options,
        )
