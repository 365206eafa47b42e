"""The public surface of the core: JSON text across, plain Python values back.

Documents may be given as ``dict`` (serialized here with ``json.dumps``), as
JSON text (``str``, passed through untouched so the core's strict decoder sees
the exact bytes: duplicate keys, floats and nulls are caught), or as UTF-8
``bytes``. Results come back as plain values decoded with ``json.loads``; the
core emits canonical key order and dicts keep it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, TypeVar, Union

from . import _core
from ._errors import DecodeError, RetryledgerError, RouteClientMissingError, from_error_json

__all__ = [
    "Document",
    "Policy",
    "LabReport",
    "validate_policy",
    "plan_next",
    "evaluate",
    "verify_bundle",
    "digest",
    "parse_retry_after",
    "classify_http",
    "judge",
    "next_repair",
    "verify_repair_chain",
    "breaker_admit",
    "breaker_record",
    "budget_deposit",
    "budget_withdraw",
    "admission_admit",
    "admission_release",
    "admission_observe",
    "key_pool_select",
    "key_pool_record",
    "key_sha256",
    "lab",
    "PolicyTemplate",
    "compile_policy_template",
]

#: A document: a mapping, JSON text, or UTF-8 encoded JSON.
Document = Union[Mapping[str, Any], str, bytes]

MAX_SAFE_INTEGER = 2**53 - 1

R = TypeVar("R")


def core_error(e: _core.CoreError) -> RetryledgerError:
    """The typed exception for an error raised by the extension module."""
    return from_error_json(str(e.args[0]))


def call(fn: Callable[..., R], *args: Any) -> R:
    """Call into the extension, raising core errors as their typed exceptions."""
    try:
        return fn(*args)
    except _core.CoreError as e:
        raise core_error(e) from None


_call = call  # for functions whose parameter is named `call`


def to_text(document: Any) -> str:
    """JSON text for a document given as a mapping, text or UTF-8 bytes."""
    if isinstance(document, str):
        return document
    if isinstance(document, (bytes, bytearray, memoryview)):
        try:
            return bytes(document).decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError("invalid_json", f"input is not UTF-8: {e}") from None
    try:
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise DecodeError("nesting_too_deep", "the document nests too deeply to encode") from None
    except (TypeError, ValueError) as e:
        raise DecodeError("invalid_json", f"not a JSON document: {e}") from None


def check_integer(name: str, value: object) -> int:
    """An integer argument in 0..=2^53-1, or the core's code for what it is instead."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DecodeError("invalid_type", f"`{name}` must be an integer", f"/{name}")
    if isinstance(value, float):
        raise DecodeError("float_value", f"`{name}` must be an integer", f"/{name}")
    if not 0 <= value <= MAX_SAFE_INTEGER:
        raise DecodeError("integer_out_of_range", f"`{name}` must be in 0..=2^53-1", f"/{name}")
    return value


def _loads(text: str) -> dict[str, Any]:
    """A JSON object the core returned, as a plain dict."""
    value: dict[str, Any] = json.loads(text)
    return value


class Policy:
    """A policy validated and digested once, then reused for every plan, evaluation and run.

    Construction checks every rule before any dispatch and raises
    :class:`PolicyError` (or :class:`DecodeError`) with the rule's code.
    """

    __slots__ = ("_compiled", "_document", "_verified_key")

    def __init__(self, policy: Document) -> None:
        self._compiled: _core.Compiled = call(_core.Compiled, to_text(policy))
        self._document: Optional[dict[str, Any]] = None
        #: The last idempotency key a driver checked against the policy's digest.
        self._verified_key: Optional[str] = None

    @property
    def sha256(self) -> str:
        """The policy digest: SHA-256 of its canonical JSON."""
        return self._compiled.sha256

    @property
    def idempotency_key_sha256(self) -> str:
        """The digest of the idempotency key every attempt must carry."""
        return self._compiled.idempotency_key_sha256

    @property
    def json(self) -> str:
        """The policy as canonical JSON."""
        return self._compiled.policy_json

    @property
    def document(self) -> dict[str, Any]:
        """The policy as a plain dict, in canonical key order."""
        if self._document is None:
            self._document = _loads(self._compiled.policy_json)
        return dict(self._document)

    def plan_next(self, attempts: Document) -> dict[str, Any]:
        """The next decision: ``{"kind": "dispatch", ...}`` or ``{"kind": "terminal", ...}``."""
        return _loads(call(self._compiled.plan_next, to_text(attempts)))

    def evaluate(self, attempts: Document) -> dict[str, Any]:
        """The receipt of a finished run."""
        return _loads(call(self._compiled.evaluate, to_text(attempts)))

    def seal(self, attempts: Document) -> dict[str, Any]:
        """The bundle (policy, attempts, receipt) of a finished run."""
        return _loads(call(self._compiled.seal, to_text(attempts)))

    def session(self) -> _core.Session:
        """A run of this policy with no attempt yet: the state machine a host drives."""
        return self._compiled.session()

    def __repr__(self) -> str:
        return f"Policy(sha256={self.sha256!r})"


#: Policies given as documents or text, compiled once by their JSON text
#: (the most recently used kept), as the npm driver does.
_COMPILED_BY_TEXT: OrderedDict[str, Policy] = OrderedDict()
_MAX_COMPILED_POLICIES = 16


def _policy_of(policy: Union[Policy, Document]) -> Policy:
    """``policy`` if compiled; else the compiled policy of a policy given as
    a mapping or text: the same text is decoded and validated once (a mapping
    changed between runs is another text, compiled again). A policy dropped
    from the cache is left to the garbage collector, since a run may still
    use it. Safe across threads without a lock: two threads may compile the
    same text at once, and either result is the same policy."""
    if isinstance(policy, Policy):
        return policy
    text = to_text(policy)
    cache = _COMPILED_BY_TEXT
    compiled = cache.get(text)
    if compiled is not None:
        try:
            cache.move_to_end(text)
        except KeyError:  # dropped by another thread meanwhile
            pass
        return compiled
    compiled = Policy(text)
    cache[text] = compiled
    while len(cache) > _MAX_COMPILED_POLICIES:
        try:
            cache.popitem(last=False)
        except KeyError:
            break
    return compiled


def _check_route_clients(compiled: Policy, clients: Mapping[str, Any], what: str) -> None:
    """Refuse, before any request, a policy with a route that ``clients`` (by
    route id) has no entry for: the core's :class:`RouteClientMissingError`
    (code ``route_client_missing``, a :class:`PolicyError` and, for code
    written before the code existed, a ``KeyError``) naming every route
    without one; ``what`` ("openai client", "httpx client") prefixes the
    message. Shared by the client integrations."""
    try:
        compiled._compiled.require_clients([k for k in clients if isinstance(k, str)])
    except RetryledgerError as e:
        if e.code != "route_client_missing":
            raise
        raise RouteClientMissingError(e.code, f"{what}: {e.message}", e.path) from None


def _policy_text(policy: Union[Policy, Document]) -> str:
    return policy.json if isinstance(policy, Policy) else to_text(policy)


def validate_policy(policy: Document) -> str:
    """The policy digest, or the first rule it breaks (:class:`PolicyError`)."""
    return call(_core.validate_policy, to_text(policy))


def plan_next(policy: Union[Policy, Document], attempts: Document) -> dict[str, Any]:
    """What to dispatch next and not before when, or the run's terminal."""
    if isinstance(policy, Policy):
        return policy.plan_next(attempts)
    return _loads(call(_core.plan_next, to_text(policy), to_text(attempts)))


def evaluate(policy: Union[Policy, Document], attempts: Document) -> dict[str, Any]:
    """The receipt of a finished run (:class:`RunError` if it could still dispatch)."""
    if isinstance(policy, Policy):
        return policy.evaluate(attempts)
    return _loads(call(_core.evaluate, _policy_text(policy), to_text(attempts)))


def verify_bundle(bundle: Document) -> dict[str, Any]:
    """Replay a bundle: ``{"kind": "verified", ...}`` or the first ``{"kind": "drift", ...}``."""
    return _loads(call(_core.verify_bundle, to_text(bundle)))


def digest(document: Document) -> str:
    """Lowercase hex SHA-256 of a document's canonical JSON (after strict decoding)."""
    return call(_core.digest, to_text(document))


def parse_retry_after(header: str, value: str, now_unix_ms: int, cap_ms: int) -> int:
    """A ``retry-after`` or ``retry-after-ms`` value as milliseconds, bounded by ``cap_ms``."""
    now = check_integer("now_unix_ms", now_unix_ms)
    cap = check_integer("cap_ms", cap_ms)
    return call(_core.parse_retry_after, header, value, now, cap)


def classify_http(observation: Document) -> dict[str, Any]:
    """A typed outcome from an HTTP observation (status, headers, transport error)."""
    return _loads(call(_core.classify_http, to_text(observation)))


def next_repair(
    links: Union[Document, List[Any]], request_sha256: str, idempotency_key_sha256: str, started_at_ms: int
) -> dict[str, Any]:
    """The policy of the next repair of a chain (docs/REPAIR.md): the root
    policy with the repair's request and key digests, the deadline left
    (``deadline_ms - started_at_ms``) and the cost left. Raises
    :class:`DriftError` ``repair_not_allowed``, ``repair_over_budget``,
    ``repair_after_terminal``, ``repair_same_request`` or
    ``repair_chain_drift`` when no repair may follow."""
    text = links if isinstance(links, str) else json.dumps(links, separators=(",", ":"), ensure_ascii=False)
    started = check_integer("started_at_ms", started_at_ms)
    return _loads(call(_core.next_repair, text, request_sha256, idempotency_key_sha256, started))


def verify_repair_chain(chain: Document) -> dict[str, Any]:
    """Replay a ``retryledger.repair_chain.v1``: ``{"kind": "verified", ...}``
    or the first ``{"kind": "drift", "link_index", ...}`` (docs/REPAIR.md)."""
    return _loads(call(_core.verify_repair_chain, to_text(chain)))


def judge(facts: Union[_core.Facts, Document]) -> dict[str, Any]:
    """The core's judgement of what a host observed of one attempt:
    ``{"outcome": {...}, "rule": "..."}`` (docs/HOSTS.md)."""
    text = facts.json if isinstance(facts, _core.Facts) else to_text(facts)
    return _loads(call(_core.judge, text))


def breaker_admit(config: Document, snapshot: Document, now_epoch_ms: int) -> dict[str, Any]:
    """Ask a circuit breaker (``retryledger.breaker.v1``) to admit one attempt at
    ``now_epoch_ms`` (wall clock, Unix ms): ``{"admission": {"kind": "admitted",
    "probe": ...} | {"kind": "rejected", ...}, "snapshot": next}``. ``config`` is
    the policy's ``fleet.breaker`` section."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    return _loads(call(_core.breaker_admit, to_text(config), to_text(snapshot), now))


def breaker_record(
    config: Document, snapshot: Document, probe: bool, outcome: Document, now_epoch_ms: int
) -> dict[str, Any]:
    """The breaker snapshot after an attempt's ``outcome`` (an outcome document);
    ``probe`` says whether the attempt was admitted as a half-open probe. Only
    outcomes that say the route is unhealthy count as failures."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    if not isinstance(probe, bool):
        raise DecodeError("invalid_type", "`probe` must be a bool", "/probe")
    return _loads(call(_core.breaker_record, to_text(config), to_text(snapshot), probe, to_text(outcome), now))


def budget_deposit(config: Document, snapshot: Document, now_epoch_ms: int) -> dict[str, Any]:
    """The retry budget (``retryledger.retry_budget.v1``) after a first attempt's
    deposit at ``now_epoch_ms``: the next snapshot."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    return _loads(call(_core.budget_deposit, to_text(config), to_text(snapshot), now))


def budget_withdraw(config: Document, snapshot: Document, now_epoch_ms: int) -> dict[str, Any]:
    """Withdraw one retry from the budget at ``now_epoch_ms``: ``{"granted": bool,
    "snapshot": next}`` (a refused withdrawal still refills the balance)."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    return _loads(call(_core.budget_withdraw, to_text(config), to_text(snapshot), now))


def admission_admit(
    config: Document,
    snapshot: Document,
    now_epoch_ms: int,
    queued_since_epoch_ms: int,
    tokens: int = 0,
    tenant: Optional[str] = None,
) -> dict[str, Any]:
    """One admission under admission limits (``retryledger.admission.v1``) at
    ``now_epoch_ms``, for an attempt that first asked at
    ``queued_since_epoch_ms`` and reserves ``tokens``: ``{"answer": {"kind":
    "admitted", "start_epoch_ms"} | {"kind": "wait", "until_epoch_ms",
    "reason"?} | {"kind": "refused", "earliest_epoch_ms"?, "reason"?},
    "snapshot": next}``. Under tenant shares (``tenant_weights``) the call
    names its ``tenant``; a tenant over its share while others want the
    capacity waits or is refused with ``"reason": "tenant_over_share"``."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    since = check_integer("queued_since_epoch_ms", queued_since_epoch_ms)
    reserved = check_integer("tokens", tokens)
    if tenant is not None and not isinstance(tenant, str):
        raise TypeError("tenant is a str")
    return _loads(call(_core.admission_admit, to_text(config), to_text(snapshot), now, since, reserved, tenant))


def admission_release(
    config: Document, snapshot: Document, now_epoch_ms: int, reserved: int, used: Optional[int] = None
) -> dict[str, Any]:
    """An admitted attempt is over: its in-flight slot freed and its
    ``reserved`` tokens settled with the ``used`` ones (``None``: not
    reported, the reservation stands). The next snapshot."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    held = check_integer("reserved", reserved)
    spent = None if used is None else check_integer("used", used)
    return _loads(call(_core.admission_release, to_text(config), to_text(snapshot), now, held, spent))


def admission_observe(
    config: Document, snapshot: Document, headers: Any, now_epoch_ms: int
) -> dict[str, Any]:
    """A response's rate-limit ``headers`` (``[name, value]`` pairs, a
    mapping, or their JSON text) applied to an admission snapshot:
    ``{"snapshot", "notes"?}`` (the snapshot unchanged when no header
    applies; ``notes``: what was ignored)."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    return _loads(call(_core.admission_observe, to_text(config), to_text(snapshot), header_text(headers), now))


def key_pool_select(
    config: Document, snapshot: Optional[Document], now_epoch_ms: int, affinity: Optional[str] = None
) -> dict[str, Any]:
    """Which key of a pool (``retryledger.key_pool.v1``; ``None``: the store
    holds none yet) the next attempt uses at ``now_epoch_ms``:
    ``{"selection": {"kind": "key", "key_sha256", "affinity"?} | {"kind":
    "wait", "until_epoch_ms"} | {"kind": "no_usable_key"}, "snapshot": next}``.
    ``affinity`` is the key digest the session used before (kept while it is
    usable). Write the snapshot back with compare-and-set."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    snap = None if snapshot is None else to_text(snapshot)
    if affinity is not None:
        _check_text("affinity", affinity)
    return _loads(call(_core.key_pool_select, to_text(config), snap, now, affinity))


def key_pool_record(
    config: Document,
    snapshot: Optional[Document],
    key_sha256: str,
    outcome: Document,
    now_epoch_ms: int,
    status: Optional[int] = None,
) -> dict[str, Any]:
    """The pool's next snapshot after the key ``key_sha256`` answered with
    ``outcome`` (an outcome document) and HTTP ``status`` (401 and 403
    disable the key until the pool's configuration changes; a rate limit
    cools it and its account's keys; an exhausted quota parks them)."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    snap = None if snapshot is None else to_text(snapshot)
    code = None if status is None else check_integer("status", status)
    _check_text("key_sha256", key_sha256)
    return _loads(call(_core.key_pool_record, to_text(config), snap, key_sha256, to_text(outcome), now, code))


def key_sha256(secret: str) -> str:
    """A pool key's identity: the hex SHA-256 of its secret, the only form
    of a key any document holds."""
    _check_text("secret", secret)
    return str(call(_core.key_sha256, secret))


def _check_text(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise DecodeError("invalid_type", f"`{name}` must be a str", f"/{name}")


def header_text(headers: Any) -> str:
    """``[name, value]`` pairs (or a mapping) as the JSON text the core reads."""
    if isinstance(headers, str):
        return headers
    items = headers.items() if hasattr(headers, "items") else headers
    return json.dumps([[str(k), str(v)] for k, v in items])


class LabReport(NamedTuple):
    """The replay lab: its report document, summary table and case table."""

    report_json: str
    summary: str
    case_table: str

    @property
    def report(self) -> dict[str, Any]:
        """The report as a plain dict."""
        return _loads(self.report_json)


def request_sha256(request: Document) -> str:
    """The digest of a logical request (``retryledger.request.v1``): SHA-256 of
    its RFC 8785 canonical JSON, numbers as ECMAScript writes them. This is the
    policy's ``logical_request_sha256``. A mapping is encoded with
    ``json.dumps`` (floats round-trip exactly); NaN and infinities are refused."""
    return call(_core.request_sha256, to_text(request))


def build_policy(request: Document, spec: Document) -> Policy:
    """Build a policy from a logical request and a policy spec
    (``retryledger.policy_spec.v1``: route releases and behavior classes as
    catalog documents in place of digests, routes in priority order, budgets).
    The core computes every digest and validates the result with the same
    codes as :func:`validate_policy`; the returned :class:`Policy` is ready
    for :func:`retryledger.run`, and ``policy.document`` is the JSON to store."""
    return Policy(call(_core.build_policy, to_text(request), to_text(spec)))


class PolicyTemplate:
    """A policy spec compiled once — routes, budgets, sections, every rule
    checked — and bound per call to its logical request and idempotency key.

    ``bind`` gives exactly the document and digest :func:`build_policy` gives
    for the spec with that key, in a few microseconds, so a function can be
    decorated once at module level (``@retry(template, ...)``). The spec leaves
    out ``idempotency_key_sha256``."""

    __slots__ = ("_template",)

    def __init__(self, spec: Document) -> None:
        self._template: _core.PolicyTemplate = call(_core.PolicyTemplate, to_text(spec))

    def bind(self, request: Document, idempotency_key_sha256: str) -> Policy:
        """The policy of one call: its logical request and the key's digest
        (:func:`idempotency_key_sha256`)."""
        compiled = call(self._template.bind, to_text(request), idempotency_key_sha256)
        policy = Policy.__new__(Policy)
        policy._compiled = compiled
        policy._document = None
        policy._verified_key = None
        return policy

    def __repr__(self) -> str:
        return "PolicyTemplate()"


def compile_policy_template(spec: Document) -> PolicyTemplate:
    """Compile a policy spec once for many calls (:class:`PolicyTemplate`)."""
    return PolicyTemplate(spec)


def check_price_schedule(policy: Union[Policy, Document], schedule: Document) -> str:
    """Check a price schedule (``retryledger.price_schedule.v1``) against a
    policy before any dispatch: the same cost unit, every route release priced
    once. Returns the schedule's digest; raises :class:`PolicyError` otherwise."""
    return call(_core.check_price_schedule, _policy_text(policy), to_text(schedule))


def price_cost(schedule: Document, route_release_sha256: str, usage: Document) -> int:
    """What raw usage (units by kind: ``input``, ``output``, ``cached_input``,
    ...) costs on a route release: the sum of ``ceil(units * price / 10**6)``.
    A kind the release does not price is ``usage_unpriced``, never a silent zero."""
    return call(_core.price_cost, to_text(schedule), route_release_sha256, to_text(usage))


def lift_request(call: str, params: Document) -> dict[str, Any]:
    """The logical request of an SDK call, from the parameters you would pass
    it: ``call`` is ``openai.chat.completions``, ``openai.responses`` or
    ``anthropic.messages``. The core's table sends messages, tools, the output
    contract, sampling and the seed into the request and keeps the model and
    transport options out of it; an unknown parameter is ``unknown_field``."""
    return _loads(_call(_core.lift_request, call, to_text(params)))


def canonical_request(request: Document) -> str:
    """A logical request's RFC 8785 canonical JSON."""
    return call(_core.canonical_request, to_text(request))


def idempotency_key_sha256(key: str, *, tenant: Optional[str] = None, operation: Optional[str] = None) -> str:
    """The digest of an idempotency key: ``sha256(key)`` for a bare key, or the
    digest of ``{key, operation, tenant}`` when both scope fields are given. The
    raw key never appears in a document."""
    return call(_core.idempotency_key_sha256, key, tenant, operation)


def lab() -> LabReport:
    """Run the replay lab: the reference run and every mutation case."""
    return LabReport(*call(_core.lab))
