"""One logical request across providers: each route through its own SDK client.

A policy spec whose routes are on different providers (an ``openai``
primary, an ``anthropic`` fallback, a ``google`` last resort) runs in one
call. The request is provider-neutral (``retryledger.request.v1`` with
``messages``, docs/LOWERING.md); the core builds the policy (leaving out,
before any dispatch, every route that cannot serve the request) and lowers
the request once per route (:func:`retryledger.lower_routes`). Each attempt
sends its route's lowered parameters through the route's client, as is:

=========================  ==============================================  =====================
route's ``lowering.api``   the call                                        served model
=========================  ==============================================  =====================
openai.chat_completions    ``client.chat.completions.create(**body)``      ``response.model``
openai.responses           ``client.responses.create(**body)``             ``response.model``
anthropic.messages         ``client.messages.create(**body)``              ``message.model``
google.generate_content    ``client.models.generate_content(model=...,     ``model_version``
                           contents=body["contents"], config=...)``
=========================  ==============================================  =====================

A body field the SDK method does not name goes in ``extra_body``, so the
request on the wire is the lowered body. For ``google`` the lowered body is
the REST body, given whole as the call's ``HttpOptions(extra_body=...)``,
which the SDK merges over the request it builds (its ``contents`` replaced
by the body's), so the wire body is again the lowered body.

    clients = {
        "openai": OpenAI(max_retries=0),
        "anthropic": Anthropic(max_retries=0),
        "google": genai.Client(api_key=...),
    }
    result = retryledger.providers.run(request, spec, clients, idempotency_key)
    result.value                          # the answer of the route that completed
    result.receipt["schedule"][-1]["model"]  # {"requested": ..., "served": ...}

``clients`` maps every route id of the built policy to its client (sync
clients for :func:`run` and :func:`stream`, ``AsyncOpenAI`` /
``AsyncAnthropic`` / ``genai.Client`` for the ``_async`` functions); a route
without one is :class:`retryledger.RouteClientMissingError`
(``route_client_missing``) before any request, a client of another SDK than
the route's wire is :class:`retryledger.DecodeError` ``invalid_type`` (at
``/clients/<route id>``), and a client whose own retries are on is
``retry_owner_not_harness``. Each attempt's client
carries the run's ``Idempotency-Key`` and the remaining deadline as its
timeout.

Each attempt records the SHA-256 of its route's lowered body
(``request_body_sha256``: a retry on the route sends the same body) and
the model it asked for; the model the provider's answer named is recorded
as ``served`` (docs/LOWERING.md, "Which model answered"). An answer without
a model records none; an answer without usage charges nothing (the
attempt's reservation stands): neither is invented.

:func:`stream` and :func:`stream_async` run the policy's stream contract
(docs/STREAMING.md) over each route's own stream (``stream=True``; chat
completions with ``stream_options={"include_usage": True}``;
``generate_content_stream`` for ``google``): under ``tentative`` a stream
cut after its first events is invalidated (one ``invalidate`` event) before
the next route's events.

Options (``clock``, ``sleep``, hooks, ``price_schedule``, ``fleet``,
``checks``, ...) are :func:`retryledger.run`'s and
:func:`retryledger.run_stream`'s.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Any, Awaitable, Callable, Dict, Mapping, Optional, Tuple

from ._api import Document, Policy, _check_route_clients, build_policy
from ._driver import RunResult, Step, run as _run, run_async as _run_async
from ._errors import DecodeError
from ._integration import IDEMPOTENCY_HEADER, report_tokens, require_max_retries_zero
from ._stream import AsyncStreamRun, StreamRun, StreamStep, run_stream as _run_stream, run_stream_async as _run_stream_async
from .lowering import Lowered, lower_routes

__all__ = ["Prepared", "Route", "prepare", "run", "run_async", "stream", "stream_async"]


class Route:
    """One route of a prepared run: its client and the request lowered for it."""

    __slots__ = ("route_id", "client", "lowered", "wire")

    def __init__(self, route_id: str, client: Any, lowered: Lowered) -> None:
        #: The route id.
        self.route_id = route_id
        #: The route's SDK client.
        self.client = client
        #: The request lowered for the route (``api``, ``body``, ``body_sha256``, ``model``, ``notes``).
        self.lowered = lowered
        self.wire = _WIRES[lowered["api"]]

    def __repr__(self) -> str:
        return f"Route({self.route_id!r}, api={self.lowered['api']!r}, model={self.lowered['model']!r})"


class Prepared:
    """A cross-provider run checked before any request: the built policy and,
    per route id, its :class:`Route`."""

    __slots__ = ("policy", "routes")

    def __init__(self, policy: Policy, routes: Dict[str, Route]) -> None:
        #: The policy built from the spec (routes that cannot serve the request left out).
        self.policy = policy
        #: Every route of the policy, by id.
        self.routes = routes

    def begin(self, step: Step) -> Route:
        """The attempt's route, after recording what it sends: the lowered
        body's digest and the model it asks for."""
        route = self.routes[step.route_id]
        step.request_body_digest(route.lowered["body_sha256"])
        step.set_model(route.lowered["model"])
        return route


def prepare(request: Document, spec: Document, clients: Mapping[str, Any]) -> Prepared:
    """Build the policy (:func:`retryledger.build_policy`), require a client
    for each of its routes (``route_client_missing``), lower the request for
    each (:func:`retryledger.lower_routes`) and check each client for the
    route's SDK (its own retries off: ``retry_owner_not_harness``). Nothing
    is sent."""
    policy = build_policy(request, spec)
    _check_route_clients(policy, clients, "provider client")
    lowered = {r["route_id"]: r["lowered"] for r in lower_routes(request, spec)}
    routes: Dict[str, Route] = {}
    for entry in policy.document["routes"]:
        route_id = entry["route_id"]
        route = Route(route_id, clients[route_id], lowered[route_id])
        route.wire.speaks(route)
        route.wire.check(route.client)
        routes[route_id] = route
    return Prepared(policy, routes)


# ---- the wires -----------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _named(method: Any) -> Optional[frozenset[str]]:
    """The keyword parameters an SDK method names (``None``: it takes any)."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params) - {"self", "extra_body", "extra_headers", "extra_query", "timeout"}


def _kwargs(method: Any, body: Mapping[str, Any]) -> Dict[str, Any]:
    """``body`` as the method's keyword arguments: a field it does not name
    goes in ``extra_body``, so the request on the wire is ``body``."""
    named = _named(getattr(method, "__func__", method))
    if named is None:
        return dict(body)
    kwargs = {k: v for k, v in body.items() if k in named}
    extra = {k: v for k, v in body.items() if k not in named}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


class _Wire:
    """How one wire is sent through its SDK: the client check, the call (sync,
    async, streamed), the served model of an answer or a stream event, the
    usage units of an answer and the stream reader."""

    name = ""
    #: The attribute path of the SDK method the wire calls.
    path: Tuple[str, ...] = ()

    def speaks(self, route: "Route") -> None:
        """Refuse, before any request, a client without the wire's SDK method
        (another provider's client on the route): ``invalid_type`` at
        ``/clients/<route id>``."""
        holder: Any = route.client
        for name in self.path:
            holder = getattr(holder, name, None)
        if not callable(holder):
            raise DecodeError(
                "invalid_type",
                f"the client of route {route.route_id!r} has no {'.'.join(self.path)}(): "
                f"{route.lowered['api']} needs a {self.name} client",
                f"/clients/{route.route_id}",
            )

    def check(self, client: Any) -> None:
        require_max_retries_zero(client, self.name)

    def attempt_client(self, client: Any, step: Step, timeout_s: float) -> Any:
        return client.with_options(timeout=timeout_s, default_headers={IDEMPOTENCY_HEADER: step.idempotency_key})

    def method(self, client: Any) -> Any:
        raise NotImplementedError

    def call(self, client: Any, lowered: Lowered, step: Step, timeout_s: float, stream: bool, aio: bool) -> Any:
        """Send ``lowered`` for ``step``: the SDK's answer (a stream when
        ``stream``; an awaitable of it from an async client, or with ``aio``)."""
        method = self.method(self.attempt_client(client, step, timeout_s))
        kwargs = _kwargs(method, lowered["body"])
        if stream:
            kwargs.update(self.stream_options())
        return method(**kwargs)

    def stream_options(self) -> Dict[str, Any]:
        return {"stream": True}

    def served(self, value: Any) -> Optional[str]:
        return _str(getattr(value, "model", None))

    def served_in_event(self, event: Any) -> Optional[str]:
        return None

    def usage_units(self, value: Any) -> Optional[Dict[str, Any]]:
        raise NotImplementedError

    def reader(self) -> Any:
        raise NotImplementedError


class _OpenaiChat(_Wire):
    name = "openai"
    path: Tuple[str, ...] = ("chat", "completions", "create")

    def method(self, client: Any) -> Any:
        return client.chat.completions.create

    def stream_options(self) -> Dict[str, Any]:
        return {"stream": True, "stream_options": {"include_usage": True}}

    def served_in_event(self, event: Any) -> Optional[str]:
        return _str(getattr(event, "model", None))

    def usage_units(self, value: Any) -> Optional[Dict[str, Any]]:
        from .openai import usage_units

        return usage_units(value)

    def reader(self) -> Any:
        from .openai import CHAT_READER

        return CHAT_READER


class _OpenaiResponses(_OpenaiChat):
    path = ("responses", "create")

    def method(self, client: Any) -> Any:
        return client.responses.create

    def stream_options(self) -> Dict[str, Any]:
        return {"stream": True}

    def served_in_event(self, event: Any) -> Optional[str]:
        return _str(getattr(getattr(event, "response", None), "model", None))

    def reader(self) -> Any:
        from .openai import RESPONSES_READER

        return RESPONSES_READER


class _Anthropic(_Wire):
    name = "anthropic"
    path = ("messages", "create")

    def attempt_client(self, client: Any, step: Step, timeout_s: float) -> Any:
        return client.with_options(
            timeout=timeout_s, max_retries=0, default_headers={IDEMPOTENCY_HEADER: step.idempotency_key}
        )

    def method(self, client: Any) -> Any:
        return client.messages.create

    def served_in_event(self, event: Any) -> Optional[str]:
        if getattr(event, "type", None) != "message_start":
            return None
        return _str(getattr(getattr(event, "message", None), "model", None))

    def usage_units(self, value: Any) -> Optional[Dict[str, Any]]:
        from .anthropic import usage_units

        return usage_units(value)

    def reader(self) -> Any:
        from .anthropic import MESSAGES_READER

        return MESSAGES_READER


class _Google(_Wire):
    name = "google-genai"
    path = ("models", "generate_content")

    def check(self, client: Any) -> None:
        from .google_genai import require_no_retries

        require_no_retries(client)

    def arguments(self, lowered: Lowered, step: Step, timeout_s: float) -> Dict[str, Any]:
        """``generate_content``'s arguments for the REST body: the whole body
        as the request's ``HttpOptions.extra_body``, which the SDK merges
        over the request it builds (a list replaced, an object merged key by
        key), so the wire body is the lowered body byte for byte in meaning
        (the SDK's own conversion would write some fields in snake case and
        bytes in URL-safe base64). ``contents`` are also given to the SDK,
        read in their REST form, because it requires them."""
        from google.genai import types

        body = lowered["body"]
        options = types.HttpOptions(
            headers={IDEMPOTENCY_HEADER: step.idempotency_key},
            timeout=max(1, int(timeout_s * 1000)),
            extra_body=dict(body),
        )
        contents = [types.Content.model_validate_json(json.dumps(c)) for c in body.get("contents") or ()]
        return {
            "model": lowered["model"],
            "contents": contents,
            "config": types.GenerateContentConfig(http_options=options),
        }

    def call(self, client: Any, lowered: Lowered, step: Step, timeout_s: float, stream: bool, aio: bool) -> Any:
        models = client.aio.models if aio else client.models
        method = models.generate_content_stream if stream else models.generate_content
        return method(**self.arguments(lowered, step, timeout_s))

    def served(self, value: Any) -> Optional[str]:
        return _str(getattr(value, "model_version", None))

    def served_in_event(self, event: Any) -> Optional[str]:
        return _str(getattr(event, "model_version", None))

    def usage_units(self, value: Any) -> Optional[Dict[str, Any]]:
        from .google_genai import usage_units

        return usage_units(value)

    def reader(self) -> Any:
        from .google_genai import GENERATE_CONTENT_READER

        return GENERATE_CONTENT_READER


_WIRES: Dict[str, _Wire] = {
    "openai.chat_completions": _OpenaiChat(),
    "openai.responses": _OpenaiResponses(),
    "anthropic.messages": _Anthropic(),
    "google.generate_content": _Google(),
}

def _answered(route: Route, step: Step, value: Any) -> Any:
    """Record what an answer says: the served model (none when it names
    none), its usage charged under a price schedule and its tokens reported
    (nothing when it carries none)."""
    step.set_model(route.lowered["model"], route.wire.served(value))
    try:
        units = route.wire.usage_units(value)
    except Exception:
        units = None
    if units is not None and step.price_schedule is not None:
        step.usage(units)
    report_tokens(step, value, route.wire.usage_units, units)
    return value


# ---- the drivers -----------------------------------------------------------------


def run(request: Document, spec: Document, clients: Mapping[str, Any], idempotency_key: str, **options: Any) -> RunResult[Any]:
    """Run ``request`` over the spec's routes, each through its client in
    ``clients`` (by route id): :func:`retryledger.run` with each attempt
    sending its route's lowered body. The value is the completing route's
    SDK answer."""
    prepared = prepare(request, spec, clients)

    def dispatch(step: Step) -> Any:
        route = prepared.begin(step)
        value = route.wire.call(route.client, route.lowered, step, step.remaining_ms / 1000.0, False, False)
        return _answered(route, step, value)

    return _run(prepared.policy, dispatch, idempotency_key, **options)


async def run_async(
    request: Document, spec: Document, clients: Mapping[str, Any], idempotency_key: str, **options: Any
) -> RunResult[Any]:
    """:func:`run` over async clients (``AsyncOpenAI``, ``AsyncAnthropic``,
    ``genai.Client`` through its ``aio`` side)."""
    prepared = prepare(request, spec, clients)

    async def dispatch(step: Step) -> Any:
        route = prepared.begin(step)
        opened: Awaitable[Any] = route.wire.call(route.client, route.lowered, step, step.remaining_ms / 1000.0, False, True)
        value = await opened
        return _answered(route, step, value)

    return await _run_async(prepared.policy, dispatch, idempotency_key, **options)


class _RouteReader:
    """The stream reader of a cross-provider stream: each attempt's events
    are read by its route's reader, and the first event that names the
    served model records it."""

    def __init__(self) -> None:
        self._reader: Any = None
        self._route: Optional[Route] = None
        self._step: Optional[Step] = None

    def begin(self, route: Route, step: Step) -> None:
        self._reader = route.wire.reader()
        self._route = route
        self._step = step

    def text(self, event: Any) -> str:
        route, step = self._route, self._step
        if route is not None and step is not None:
            served = route.wire.served_in_event(event)
            if served is not None:
                step.set_model(route.lowered["model"], served)
                self._step = None  # recorded once per attempt
        text: str = self._reader.text(event)
        return text

    def sequence(self, event: Any) -> Optional[int]:
        seq: Optional[int] = self._reader.sequence(event)
        return seq

    def response_id(self, event: Any) -> Optional[str]:
        ident: Optional[str] = self._reader.response_id(event)
        return ident

    def is_terminal(self, event: Any) -> bool:
        return bool(self._reader.is_terminal(event))

    def usage(self, event: Any) -> Optional[Mapping[str, Any]]:
        units: Optional[Mapping[str, Any]] = self._reader.usage(event)
        return units


def _opener(prepared: Prepared, reader: _RouteReader, is_async: bool) -> Callable[[StreamStep], Any]:
    def open_stream(step: StreamStep) -> Any:
        route = prepared.begin(step)
        reader.begin(route, step)
        return route.wire.call(route.client, route.lowered, step, step.timeout_s, True, is_async)

    return open_stream


def _streamed(request: Document, spec: Document, clients: Mapping[str, Any], is_async: bool) -> Tuple[Prepared, _RouteReader, Callable[[StreamStep], Any]]:
    prepared = prepare(request, spec, clients)
    reader = _RouteReader()
    return prepared, reader, _opener(prepared, reader, is_async)


def stream(request: Document, spec: Document, clients: Mapping[str, Any], idempotency_key: str, **options: Any) -> StreamRun:
    """Stream ``request`` over the spec's routes, each through its client:
    :func:`retryledger.run_stream` with each attempt opening its route's
    stream of the lowered body and read by the route's reader."""
    prepared, reader, open_stream = _streamed(request, spec, clients, False)
    return _run_stream(prepared.policy, open_stream, idempotency_key, reader=reader, **options)


def stream_async(
    request: Document, spec: Document, clients: Mapping[str, Any], idempotency_key: str, **options: Any
) -> AsyncStreamRun:
    """:func:`stream` over async clients."""
    prepared, reader, open_stream = _streamed(request, spec, clients, True)
    return _run_stream_async(prepared.policy, open_stream, idempotency_key, reader=reader, **options)
