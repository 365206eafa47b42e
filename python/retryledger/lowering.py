"""One logical request, lowered per route (docs/LOWERING.md).

A logical request with ``messages`` is provider-neutral. A route release
(``retryledger.route_release.v1``) with ``lowering`` settings names its wire
(``openai.chat_completions``, ``openai.responses``, ``anthropic.messages``,
``google.generate_content``) and what the route can take; the core turns the
request into that SDK call's parameters, or refuses the route with a coded
error (``capability_missing``, ``provider_bound_history``) before any
dispatch.
"""

from __future__ import annotations

import json
from typing import Any, List, Literal, Optional, TypedDict

from . import _core
from ._api import Document, call, to_text

Api = Literal[
    "openai.chat_completions",
    "openai.responses",
    "anthropic.messages",
    "google.generate_content",
]
NoteKind = Literal[
    "clamped_to_ceiling",
    "dropped_unsupported",
    "dropped_provider_bound",
    "tool_call_id_rewritten",
]


class LoweringNote(TypedDict):
    """A change lowering made, at the request's JSON Pointer."""

    path: str
    what: NoteKind


class Lowered(TypedDict):
    """A request lowered for one route."""

    api: Api
    """The wire."""
    body: dict[str, Any]
    """The SDK call's parameters (for ``google``, the REST body; the model is in the URL)."""
    body_sha256: str
    """SHA-256 of the body's RFC 8785 form: the attempt's ``request_body_sha256``."""
    model: str
    """The model the route asks for."""
    notes: List[LoweringNote]
    """What was clamped, dropped or rewritten, in request order."""


class _RouteCapabilityRequired(TypedDict):
    route_id: str
    capable: bool


class RouteCapability(_RouteCapabilityRequired, total=False):
    """Whether a route can serve a request; when not, the code and the request's pointer."""

    code: str
    path: str


class RouteCapabilities(TypedDict):
    """The answer of :func:`route_capabilities`: one entry per route, in order."""

    routes: List[RouteCapability]


def lower_request(request: Document, release: Document, options: Optional[Document] = None) -> Lowered:
    """Lower a logical request with ``messages`` for a route release.

    ``options`` may say ``{"provider_bound_parts": "drop"}``: a part bound to
    another provider family is then left out (and noted) instead of refusing
    the route with ``provider_bound_history``. Raises :class:`PolicyError`
    (``capability_missing``, ``provider_bound_history``) when the route
    cannot serve the request, :class:`DecodeError` for a malformed one.
    """
    opts = to_text(options) if options is not None else None
    value: Lowered = json.loads(call(_core.lower_request, to_text(request), to_text(release), opts))
    return value


class LoweredRoute(TypedDict):
    """One route of :func:`lower_routes`: its id and the request lowered for it."""

    route_id: str
    lowered: Lowered


def lower_routes(request: Document, spec: Document) -> List[LoweredRoute]:
    """The request lowered for each route of a policy spec that can serve it,
    in the spec's order (the spec's ``provider_bound_parts`` applies): what
    each route's attempts send. A route that cannot serve it is left out, as
    ``build_policy`` leaves it out; :class:`PolicyError` ``no_capable_route``
    when none can; :class:`DecodeError` ``missing_field`` at
    ``/routes/<i>/release/lowering`` for a capable route whose release has no
    lowering settings."""
    value: List[LoweredRoute] = json.loads(call(_core.lower_routes, to_text(request), to_text(spec)))["routes"]
    return value


def route_capabilities(request: Document, spec: Document) -> RouteCapabilities:
    """For each route of a policy spec (``retryledger.policy_spec.v1``), whether it
    can serve the request; ``build_policy`` leaves out those that cannot and
    raises ``no_capable_route`` when none can."""
    value: RouteCapabilities = json.loads(call(_core.route_capabilities, to_text(request), to_text(spec)))
    return value


__all__ = [
    "Api",
    "Lowered",
    "LoweredRoute",
    "LoweringNote",
    "NoteKind",
    "RouteCapabilities",
    "RouteCapability",
    "lower_request",
    "lower_routes",
    "route_capabilities",
]
