"""What the framework adapters (``langchain``, ``pydantic_ai``) share: the
per-call policy, the key, the refusal of route models that retry on their
own, the usage charge and the receipt they attach to the framework's result.

A framework model is built once and called many times, and each call is one
logical request: the adapters take a policy spec (``retryledger.policy_spec.v1``)
and build each call's policy from it with :func:`retryledger.build_policy`,
the logical request (``retryledger.request.v1``) made from the messages the
framework hands over (provider-neutral: each route's own model lowers them)
and the digest of the call's idempotency key. The run itself is the
package's drivers' (``retryledger.run`` and its twins): an adapter only
supplies the dispatch.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from ._api import Policy, PolicyTemplate, build_policy, idempotency_key_sha256, to_text
from ._driver import RunCancelledError, RunStoppedError, Step
from ._errors import DecodeError, PolicyError
from ._sending import hook_sdk

#: The driver options an adapter passes through to every run, unchanged.
DRIVER_OPTIONS = frozenset(
    {
        "classify",
        "clock",
        "sleep",
        "wall_clock",
        "on_attempt",
        "on_cancel",
        "price_schedule",
        "fleet",
        "reserve_tokens",
        "on_decision",
        "on_sleep",
        "on_terminal",
        "checks",
    }
)

_STREAM_DRIVER_OPTIONS = DRIVER_OPTIONS - {"checks"}

#: Options the adapters take themselves: ``telemetry`` (a
#: :class:`retryledger.otel.RunTelemetry`) records every run as it ends.
ADAPTER_OPTIONS = frozenset({"telemetry"})

#: Where the core refuses a template for a route with lowering settings.
_LOWERED_ROUTE = re.compile(r"/routes/[0-9]+/release/lowering")

#: What a run that does not complete raises, carrying the sealed run.
STOPS = (RunStoppedError, RunCancelledError)


def record(options: Mapping[str, Any], run: Any) -> None:
    """Write the run's spans with the ``telemetry`` option, if any (a result,
    a stopped run's error or a streamed run: anything with its bundle)."""
    telemetry = options.get("telemetry")
    if telemetry is not None:
        telemetry.record(run)


def driver_options(options: Mapping[str, Any], *, stream: bool = False, is_async: bool = False) -> Dict[str, Any]:
    """The options a driver takes, from an adapter's ``options``: an unknown
    name is refused (``PolicyError("unknown_option")``), never dropped."""
    allowed = _STREAM_DRIVER_OPTIONS if stream else DRIVER_OPTIONS
    out: Dict[str, Any] = {}
    for name, value in options.items():
        if name in ADAPTER_OPTIONS:
            continue
        if name not in DRIVER_OPTIONS:
            raise PolicyError("unknown_option", f"the drivers take no option {name!r}", f"/options/{name}")
        if name == "on_cancel" and not is_async:
            continue
        if name in allowed and value is not None:
            out[name] = value
    return out


def spec_of(spec: Any) -> Dict[str, Any]:
    """A policy spec as a dict (from a dict or JSON text), checked to be one.
    It may carry the policy's ``repair`` section, which the built policy
    takes (docs/REPAIR.md)."""
    import json

    if isinstance(spec, Policy):
        raise PolicyError(
            "policy_spec_expected",
            "a framework model makes one logical request per call: give it a policy spec "
            "(retryledger.policy_spec.v1, without idempotency_key_sha256), not a compiled policy",
            "/schema",
        )
    document = json.loads(to_text(spec))
    if not isinstance(document, dict) or document.get("schema") != "retryledger.policy_spec.v1":
        raise PolicyError(
            "policy_spec_expected", "expected a retryledger.policy_spec.v1 document", "/schema"
        )
    return document


def route_ids(spec: Mapping[str, Any]) -> Tuple[str, ...]:
    return tuple(str(r.get("route_id")) for r in spec.get("routes") or () if isinstance(r, Mapping))


def check_routes(spec: Mapping[str, Any], models: Mapping[str, Any], what: str) -> None:
    """Every route of the spec has a model and every model a route."""
    ids = route_ids(spec)
    missing = [r for r in ids if r not in models]
    if missing:
        raise PolicyError("route_model_missing", f"no {what} for route(s) {', '.join(missing)}", "/routes")
    extra = [r for r in models if r not in ids]
    if extra:
        raise PolicyError("route_model_unknown", f"{what} for route(s) the policy does not have: {', '.join(extra)}", "/routes")


def refuse_retries(retries: Any, what: str, path: str = "/max_retries") -> None:
    """``PolicyError("retry_owner_not_harness")`` unless ``retries`` is 0."""
    if retries != 0 or isinstance(retries, bool):
        raise PolicyError(
            "retry_owner_not_harness",
            f"{what} retries on its own (max_retries={retries!r}); "
            "build it with max_retries=0 so that retryledger owns every retry",
            path,
        )


def retrying_transport(http: Any) -> Optional[str]:
    """The transport of an HTTP client (``httpx`` or the SDKs' copy) that
    retries on its own, named: one made with ``retries`` above 0, or a
    retrying wrapper (``pydantic_ai.retries``' tenacity transports)."""
    mounts = getattr(http, "_mounts", None)
    transports = [getattr(http, "_transport", None), *(mounts.values() if isinstance(mounts, Mapping) else ())]
    for transport in transports:
        if transport is None:
            continue
        name = type(transport).__name__
        if "Tenacity" in name or "Retry" in name:
            return name
        retries = getattr(getattr(transport, "_pool", None), "_retries", 0)
        if isinstance(retries, int) and not isinstance(retries, bool) and retries > 0:
            return f"{name}(retries={retries})"
    return None


def refuse_sdk_clients(clients: Iterable[Any], what: str) -> None:
    """Refuse any SDK client among ``clients`` whose ``max_retries`` is not 0
    or whose HTTP client's transport retries, then hook the others (the
    Idempotency-Key and body digest of each attempt)."""
    found = [c for c in clients if c is not None]
    for client in found:
        if hasattr(client, "max_retries"):
            refuse_retries(getattr(client, "max_retries"), f"the SDK client of {what}")
        transport = retrying_transport(getattr(client, "_client", None))
        if transport is not None:
            raise PolicyError(
                "retry_owner_not_harness",
                f"the SDK client of {what} sends through a transport that retries ({transport}); "
                "give it an HTTP client without retries so that retryledger owns every retry",
                "/http_client",
            )
    for client in found:
        hook_sdk(client)


def template_of(spec: Mapping[str, Any]) -> Optional[PolicyTemplate]:
    """The spec compiled once (without its ``repair`` section, which each
    call's policy takes after binding), so that each call binds its request
    and key instead of building the whole policy; ``None`` for a spec whose
    routes carry lowering settings, which :func:`build_policy` checks against
    each request (docs/LOWERING.md)."""
    try:
        return PolicyTemplate({k: v for k, v in spec.items() if k != "repair"})
    except DecodeError as refused:
        if refused.code == "invalid_value" and refused.path is not None and _LOWERED_ROUTE.fullmatch(refused.path):
            return None
        raise


class CallPolicy:
    """One call's key and policy: bound from the spec's template (exactly the
    document and digest :func:`build_policy` gives, see
    :class:`PolicyTemplate`), or built from the spec when it has none."""

    __slots__ = ("key", "policy", "request", "key_scope")

    def __init__(
        self,
        spec: Mapping[str, Any],
        request: Dict[str, Any],
        key: Optional[str],
        key_scope: Optional[Tuple[str, str]],
        template: Optional[PolicyTemplate] = None,
    ) -> None:
        if key is not None and not isinstance(key, str):
            raise PolicyError("idempotency_key_invalid", "an idempotency key is a string", "/idempotency_key")
        self.key = key if key is not None else f"retryledger-{uuid.uuid4().hex}"
        tenant, operation = key_scope if key_scope is not None else (None, None)
        key_sha256 = idempotency_key_sha256(self.key, tenant=tenant, operation=operation)
        repair = spec.get("repair")
        self.request = request
        self.key_scope = key_scope
        if template is not None:
            policy = template.bind(request, key_sha256)
        else:
            document = {k: v for k, v in spec.items() if k != "repair"}
            document["idempotency_key_sha256"] = key_sha256
            policy = build_policy(request, document)
        if repair is not None:
            # The spec's builder has no repair section: the built policy takes
            # it, and the core checks and digests the result once more.
            policy = Policy({**policy.document, "repair": repair})
        self.policy = policy


def usage_units(usage: Any) -> Optional[Dict[str, int]]:
    """Price units of a framework's token usage (``input_tokens``,
    ``output_tokens`` and their details: cache reads, reasoning), only the
    nonzero ones; ``None`` when there is none."""
    if usage is None:
        return None

    def get(holder: Any, name: str) -> Any:
        if holder is None:
            return None
        return holder.get(name) if isinstance(holder, Mapping) else getattr(holder, name, None)

    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    given, made = count(get(usage, "input_tokens")), count(get(usage, "output_tokens"))
    details_in, details_out = get(usage, "input_token_details"), get(usage, "output_token_details")
    cached = count(get(details_in, "cache_read")) or count(get(usage, "cache_read_tokens"))
    written = count(get(details_in, "cache_creation")) or count(get(usage, "cache_write_tokens"))
    reasoning = count(get(details_out, "reasoning"))
    units = {
        "input": given - cached - written,
        "cached_input": cached,
        "cache_creation_input": written,
        "output": made - reasoning,
        "reasoning": reasoning,
    }
    out = {kind: n for kind, n in units.items() if n > 0}
    return out or None


def charge(step: Step, usage: Any) -> None:
    """Charge ``usage`` on the attempt when the run has a price schedule, and
    report its tokens for the fleet's admission release."""
    units = usage_units(usage)
    if units is None:
        return
    if step.price_schedule is not None:
        step.usage(units)
    step.tokens_used(sum(units.values()))


def summary(result: Any) -> Dict[str, Any]:
    """What a framework result carries of the run: the receipt, its digest,
    the terminal, the bundle's text and, after a repair, the chain."""
    out: Dict[str, Any] = {
        "receipt_sha256": result.receipt_sha256,
        "terminal": result.terminal,
        "receipt": result.receipt,
        "bundle_json": result.bundle_json,
    }
    chain = getattr(result, "chain", None)
    if chain is not None:
        out["chain"] = chain
    return out
