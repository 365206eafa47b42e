"""Fleet protection across runs, processes and machines: circuit breakers per
route release and a retry budget per scope, kept in a shared store
(docs/FLEET.md).

A :class:`Fleet` holds a store (:mod:`retryledger.stores`: memory, SQLite,
Redis, PostgreSQL), a namespace that prefixes every key, and how many compare-and-set
conflicts one admission may meet. The drivers (``run``, ``run_async``,
``run_stream``, ``run_stream_async`` and the SDK wrappers) take it as
``fleet=`` and, for a policy with a ``fleet`` section, before each dispatch
admit the attempt and after the observation record its outcome in its
route's breaker. The view is the breaker of every route of the policy
(``<namespace>/breaker/<route_release_sha256>``) and the retry budget
(``<namespace>/budget/<scope>``).

With a store that has the multi-key check-and-set (``check_and_set_raw``:
every store here), an attempt costs the store one round trip to admit and
one to record in the steady state. The fleet keeps, per key, the last
document and store generation it read or wrote (a bounded cache, dropped
whenever the store cannot be reached); the generation is the store's version
counter and rises on every write, so a check-and-set that succeeds proves
the cached snapshots were current.

1. admission (optimistic): the view is built from the cache (the breaker of
   every route and the budget; a key not cached counts as absent, generation
   0), the session previews its answer under it (``session.admit_preview``:
   the answer ``admit`` would give, nothing changed), and one check-and-set
   carries an entry for every key of the view: a check-only entry (expected:
   the cached generation) for each key the admission does not change, then
   a write for each snapshot it changed, the budget first. Check-only
   entries are checked first; writes are made in order, each only when its
   key is still at the generation expected, stopping at the first that is
   not. When every entry matched, the session admits under the same view
   (``session.admit``: the same answer, now committed) and the cache takes
   the written snapshots. Otherwise the answer holds every key's current
   document and generation: the cache is refreshed from it (no separate
   read) and the admission previewed again, at most ``max_conflicts``
   times. A write applied before the mismatch (the budget's, written first)
   stays in the store and in the refreshed cache, and the admission that
   follows builds on it: a budget deposit (or spend) may so count twice,
   bounded by ``max_conflicts``, whereas a probe reserved in a breaker and
   then abandoned would hold a half-open breaker's probe slot. A cold cache
   (a fresh fleet, or the cache dropped) costs one check-and-set more when
   the store holds the keys. When the preview under cached snapshots says
   the store regressed (a cache dropped after the session saw newer
   snapshots), the view is read from the store once before the store is
   taken as having lost state;
2. record: the breaker's next snapshot (``session.breaker_after``) is
   computed from the cached one (read or written by the admission) and
   written with the same check-and-set (one round trip). When another
   process wrote first nothing is written and the answer holds the key's
   current document and generation: the cache is refreshed from it and the
   outcome recorded again (no separate read).

A store with only ``get`` and ``compare_and_set`` is read before every
admission and record, and each changed snapshot written with its own
compare-and-set (the budget first).

At most ``max_conflicts`` conflicts are met per admission (or record), then
the core's ``store_conflict`` is raised (:class:`RunError`), never a silent
admit. A store that cannot be reached, or that answers with state older than
the run has already seen (a restarted store that lost its data), is reported
to the core as unavailable: ``fail_closed`` ends the run
``stop_store_unavailable``, ``fail_open`` dispatches and the attempt and
receipt say so.

Store calls are synchronous; the async drivers make them inline (each is one
local or network round trip).
"""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _core
from ._api import Policy, call, check_integer, to_text
from ._errors import RetryledgerError, exception_class
from .stores import Entry, MemoryStore, PostgresStore, RedisStore, Row, SQLiteStore, Store, StoreUnavailableError

__all__ = [
    "Fleet",
    "request_token_bound",
    "Store",
    "StoreUnavailableError",
    "MemoryStore",
    "SQLiteStore",
    "RedisStore",
    "PostgresStore",
    "fresh_breaker",
    "fresh_budget",
]

BREAKER_SCHEMA = "retryledger.breaker.v1"
BUDGET_SCHEMA = "retryledger.retry_budget.v1"
_UNAVAILABLE = '{"breakers":{},"store_unavailable":true}'
#: How many keys the cache of a fleet holds before it starts over.
_CACHE_MAX = 4096

_ABSENT: Row = (None, 0)


def fresh_breaker(route_release_sha256: str, now_epoch_ms: int) -> Dict[str, Any]:
    """A closed breaker with no history (what the core assumes for an absent key)."""
    return {
        "consecutive_failures": 0,
        "generation": 0,
        "probe_successes": 0,
        "probes_in_flight": 0,
        "route_release_sha256": route_release_sha256,
        "schema": BREAKER_SCHEMA,
        "state": "closed",
        "updated_at_epoch_ms": now_epoch_ms,
        "window_failures": 0,
        "window_start_epoch_ms": now_epoch_ms,
        "window_total": 0,
    }


def fresh_budget(scope: str, now_epoch_ms: int) -> Dict[str, Any]:
    """An empty retry budget (what the core assumes for an absent key)."""
    return {
        "balance_milli": 0,
        "deposits": 0,
        "generation": 0,
        "schema": BUDGET_SCHEMA,
        "scope": scope,
        "updated_at_epoch_ms": now_epoch_ms,
        "withdrawals": 0,
    }


class _Shape:
    """What a policy's fleet section asks of the store."""

    __slots__ = ("releases", "breaker", "scope", "keys", "admission", "tokens", "scoped", "shares")

    def __init__(self, policy: Policy) -> None:
        doc = policy.document
        fleet = doc.get("fleet") or {}
        releases: List[str] = []
        for route in doc.get("routes", []):
            release = route["route_release_sha256"]
            if release not in releases:
                releases.append(release)
        self.releases = releases
        self.breaker = "breaker" in fleet
        budget = fleet.get("retry_budget")
        self.scope: Optional[str] = budget["scope"] if budget is not None else None
        admission = fleet.get("admission")
        #: Whether the policy has admission limits, and whether they count tokens.
        self.admission = admission is not None
        self.tokens = admission is not None and "token_bound" in admission
        #: Whether the limits have tenant shares (each call names its tenant).
        self.shares = admission is not None and "tenant_weights" in admission
        #: The key's tail after the release: tenant and principal, when set.
        self.scoped = "".join(
            "/" + admission[part] for part in ("tenant", "principal") if admission is not None and part in admission
        )
        #: The store keys of the view, in order (breakers, then the budget,
        #: then the admission limits of every route), once known.
        self.keys: Optional[List[str]] = None


def _conflict(what: str, attempts: int) -> RetryledgerError:
    return exception_class("store_conflict")(
        "store_conflict",
        f"{what}: the store's compare-and-set conflicted {attempts} times in a row",
        None,
    )


class Fleet:
    """A store shared by the runs of a fleet, under ``namespace``.

    ``max_conflicts`` bounds the compare-and-set conflicts one admission (or
    one breaker record) may meet before the run raises ``store_conflict``.
    Counters (``admissions``, ``conflicts``, ``unavailable``, ``records``)
    tell what the fleet did; they are approximate under threads.
    """

    def __init__(
        self,
        store: Store,
        *,
        namespace: str = "retryledger",
        max_conflicts: int = 5,
        reserve_tokens: Optional[int] = None,
        tenant: Optional[str] = None,
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise ValueError("a fleet needs a non-empty namespace")
        if tenant is not None and (not isinstance(tenant, str) or not tenant):
            raise ValueError("tenant is a non-empty str")
        self.store = store
        #: The tenant this fleet's calls are made for, under tenant shares
        #: (the policy's ``fleet.admission.tenant_weights``; docs/FLEET.md,
        #: "Fair tenants"). The core refuses a policy with shares and no
        #: tenant, and a tenant the policy does not list.
        self.tenant: Optional[str] = tenant
        #: Tokens each admission reserves under a token bucket (the
        #: request's bound), unless ``admit`` is given its own.
        self.reserve_tokens: Optional[int] = (
            None if reserve_tokens is None else check_integer("reserve_tokens", reserve_tokens)
        )
        #: Admission slots released (and tokens settled).
        self.releases = 0
        self.namespace = namespace
        self.max_conflicts = check_integer("max_conflicts", max_conflicts)
        self._shapes: Dict[str, _Shape] = {}
        self._lock = threading.Lock()
        #: Per key, the last (text, store generation) read or written.
        self._cache: Dict[str, Row] = {}
        #: Admissions made (each attempt's, including fleet stops).
        self.admissions = 0
        #: Compare-and-set conflicts met (each one refreshed and re-admitted).
        self.conflicts = 0
        #: Admissions and records made without the store.
        self.unavailable = 0
        #: Breaker outcomes written back.
        self.records = 0

    def __repr__(self) -> str:
        return f"Fleet({self.store!r}, namespace={self.namespace!r})"

    # ---- keys and reads ---------------------------------------------------

    def breaker_key(self, route_release_sha256: str) -> str:
        """The store key of a route release's breaker."""
        return f"{self.namespace}/breaker/{route_release_sha256}"

    def budget_key(self, scope: str) -> str:
        """The store key of a retry budget scope."""
        return f"{self.namespace}/budget/{scope}"

    def admission_key(self, route_release_sha256: str, scoped: str = "") -> str:
        """The store key of a route release's admission limits (``scoped``:
        ``/tenant`` or ``/tenant/principal`` when the policy scopes them)."""
        return f"{self.namespace}/admission/{route_release_sha256}{scoped}"

    def admission(self, policy: Policy, route_release_sha256: str) -> Optional[Dict[str, Any]]:
        """The admission snapshot the store holds for a route release under
        the policy's scope, if any."""
        key = self.admission_key(route_release_sha256, self._shape(policy).scoped)
        return self.store.get(key)[0]

    def breaker(self, route_release_sha256: str) -> Optional[Dict[str, Any]]:
        """The breaker snapshot the store holds for a route release, if any."""
        return self.store.get(self.breaker_key(route_release_sha256))[0]

    def budget(self, scope: str) -> Optional[Dict[str, Any]]:
        """The retry budget snapshot the store holds for a scope, if any."""
        return self.store.get(self.budget_key(scope))[0]

    def _shape(self, policy: Policy) -> _Shape:
        sha = policy.sha256
        shape = self._shapes.get(sha)
        if shape is None:
            shape = _Shape(policy)
            with self._lock:
                if len(self._shapes) >= 256:
                    self._shapes.clear()
                self._shapes[sha] = shape
        return shape

    def _keys(self, shape: _Shape) -> List[str]:
        keys = shape.keys
        if keys is None:
            keys = [self.breaker_key(r) for r in shape.releases] if shape.breaker else []
            if shape.scope is not None:
                keys.append(self.budget_key(shape.scope))
            if shape.admission:
                keys.extend(self.admission_key(r, shape.scoped) for r in shape.releases)
            shape.keys = keys
        return keys

    def _read(self, keys: List[str]) -> List[Tuple[Optional[str], int]]:
        """The documents (JSON text) and generations of ``keys``: one
        ``get_many_raw`` round trip when the store has it, else ``get`` each."""
        store = self.store
        raw = getattr(store, "get_many_raw", None)
        if raw is not None:
            rows: List[Tuple[Optional[str], int]] = raw(keys)
            return rows
        out: List[Tuple[Optional[str], int]] = []
        many = getattr(store, "get_many", None)
        got = many(keys) if many is not None else [store.get(k) for k in keys]
        for document, generation in got:
            out.append((None if document is None else to_text(document), generation))
        return out

    def _cas(self, key: str, expected_generation: int, document: Dict[str, Any]) -> bool:
        raw = getattr(self.store, "compare_and_set_raw", None)
        if raw is not None:
            ok: bool = raw(key, expected_generation, to_text(document))[0]
            return ok
        return self.store.compare_and_set(key, expected_generation, document)[0]

    def _view(self, policy: Policy) -> Tuple[str, List[Row]]:
        """The view as JSON text, and what was read for each key (in the
        order of ``_keys``: breakers, then the budget)."""
        shape = self._shape(policy)
        rows = self._read(self._keys(shape))
        return self._view_text(shape, rows), rows

    @staticmethod
    def _view_text(
        shape: _Shape, rows: List[Row], reserve_tokens: Optional[int] = None, tenant: Optional[str] = None
    ) -> str:
        """The view (JSON text) of ``rows``, in the order of ``_keys``."""
        parts: List[str] = []
        limits: List[str] = []
        budget: Optional[str] = None
        n = len(shape.releases) if shape.breaker else 0
        b = n + (1 if shape.scope is not None else 0)
        for i, (text, _) in enumerate(rows):
            if text is None:
                continue
            if i < n:
                parts.append(f'"{shape.releases[i]}":{text}')
            elif i < b:
                budget = text
            else:
                limits.append(f'"{shape.releases[i - b]}":{text}')
        view = ('{"admission":{' + ",".join(limits) + "}," if shape.admission else "{") + '"breakers":{' + ",".join(parts) + "}"
        if budget is not None:
            view += ',"budget":' + budget
        if shape.tokens and reserve_tokens is not None:
            view += f',"reserve_tokens":{int(reserve_tokens)}'
        if shape.shares and tenant is not None:
            view += ',"tenant":' + json.dumps(tenant)
        return view + "}"

    def read_view(self, policy: Policy) -> Tuple[Dict[str, Any], Dict[str, int]]:
        """The fleet view of a policy (``{"breakers": {...}, "budget"?: ...}``)
        and the store generation of every key read (0 for an absent key).
        Raises :class:`StoreUnavailableError`."""
        text, rows = self._view(policy)
        view: Dict[str, Any] = json.loads(text)
        return view, {key: generation for key, (_, generation) in zip(self._keys(self._shape(policy)), rows)}

    # ---- what the drivers call ----------------------------------------------

    def admit(
        self,
        session: _core.Session,
        policy: Policy,
        at_ms: int,
        now_epoch_ms: int,
        reserve_tokens: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Admit the session's planned attempt against the store (see the
        module's documentation). Returns the core's answer ``{"decision",
        "writes"}``; afterwards ``session.next()`` is the dispatch to make or
        the fleet's terminal. Under admission limits the answer may instead
        carry ``wait_until_epoch_ms`` (the in-flight cap is full: nothing was
        admitted; admit again then), and an admitted dispatch's
        ``not_before_ms`` includes its planned queue wait. ``reserve_tokens``
        is the request's token bound when the limits have a token bucket
        (default: the fleet's ``reserve_tokens``)."""
        self.admissions += 1
        if reserve_tokens is None:
            reserve_tokens = self.reserve_tokens
        check_and_set = getattr(self.store, "check_and_set_raw", None)
        if check_and_set is None:
            return self._admit_by_reads(session, policy, at_ms, now_epoch_ms, reserve_tokens)
        shape = self._shape(policy)
        keys = self._keys(shape)
        if not keys:
            answer: Dict[str, Any] = call(session.admit, at_ms, now_epoch_ms, '{"breakers":{}}')
            return answer
        cache = self._cache
        # Whether the rows are the store's (read, or answered by a
        # check-and-set) rather than possibly older cached ones.
        fresh = False
        for _ in range(self.max_conflicts + 1):
            rows = [cache.get(key, _ABSENT) for key in keys]
            view = self._view_text(shape, rows, reserve_tokens, self.tenant)
            try:
                preview: Dict[str, Any] = call(session.admit_preview, at_ms, now_epoch_ms, view)
            except RetryledgerError as e:
                if e.code != "generation_regressed":
                    raise
                if fresh:
                    # The store lost state the run has already seen.
                    return self._without_store(session, at_ms, now_epoch_ms)
                # The cache may be older than what the session saw (dropped
                # since): read the view once.
                try:
                    rows = self._read(keys)
                except StoreUnavailableError:
                    return self._without_store(session, at_ms, now_epoch_ms)
                self._refresh(keys, rows)
                fresh = True
                view = self._view_text(shape, rows, reserve_tokens, self.tenant)
                try:
                    preview = call(session.admit_preview, at_ms, now_epoch_ms, view)
                except RetryledgerError as again:
                    if again.code == "generation_regressed":
                        return self._without_store(session, at_ms, now_epoch_ms)
                    raise
            read = dict(zip(keys, rows))
            writes = self._admission_writes(preview, read)
            written = {key for key, _, _ in writes}
            checks: List[Entry] = [(key, generation, None) for key, (_, generation) in read.items() if key not in written]
            entries = checks + writes
            try:
                ok, current = check_and_set(entries)
            except StoreUnavailableError:
                return self._without_store(session, at_ms, now_epoch_ms)
            if ok:
                answer = call(session.admit, at_ms, now_epoch_ms, view)
                self._refresh(keys, rows)
                self._written(writes)
                return answer
            self.conflicts += 1
            self._refresh([key for key, _, _ in entries], current)
            fresh = True
        raise _conflict("admission", self.max_conflicts + 1)

    def _admission_writes(self, answer: Dict[str, Any], read: Dict[str, Row]) -> List[Entry]:
        """The snapshots an admission changed, each expecting the generation
        read, the budget first: when a breaker write after it conflicts, the
        budget's write stays (the session has counted it as seen) and the
        re-admission spends or deposits again (bounded by ``max_conflicts``),
        whereas a probe reserved in a breaker and then abandoned would hold
        the half-open breaker's probe slot."""
        writes = answer["writes"]
        entries: List[Entry] = []
        budget = writes.get("budget")
        if budget is not None:
            key = self.budget_key(budget["scope"])
            entries.append((key, read.get(key, (None, 0))[1], to_text(budget)))
        for snapshot in writes["breakers"]:
            key = self.breaker_key(snapshot["route_release_sha256"])
            entries.append((key, read.get(key, (None, 0))[1], to_text(snapshot)))
        # Admission limits last: an in-flight slot taken and then abandoned
        # (a write before it conflicting) would hold the slot until released.
        for snapshot in writes.get("admission", ()):
            key = self._admission_key_of(snapshot)
            entries.append((key, read.get(key, (None, 0))[1], to_text(snapshot)))
        return entries

    def _admission_key_of(self, snapshot: Dict[str, Any]) -> str:
        scoped = "".join("/" + snapshot[part] for part in ("tenant", "principal") if part in snapshot)
        return self.admission_key(snapshot["route_release_sha256"], scoped)

    def _refresh(self, keys: List[str], rows: List[Row]) -> None:
        """Cache what the store answered for ``keys``."""
        cache = self._cache
        if len(cache) + len(keys) > _CACHE_MAX:
            cache.clear()
        for key, row in zip(keys, rows):
            cache[key] = row

    def _written(self, entries: List[Entry]) -> None:
        """Cache a check-and-set that succeeded: each written key one generation on."""
        cache = self._cache
        if len(cache) + len(entries) > _CACHE_MAX:
            cache.clear()
        for key, expected, text in entries:
            if text is not None:
                cache[key] = (text, expected + 1)

    def _admit_by_reads(
        self,
        session: _core.Session,
        policy: Policy,
        at_ms: int,
        now_epoch_ms: int,
        reserve_tokens: Optional[int] = None,
    ) -> Dict[str, Any]:
        """Admission with a store that has only ``get`` and ``compare_and_set``
        (read, admit, write back each changed snapshot; re-read on a conflict)."""
        cas = self._cas
        shape = self._shape(policy)
        keys = self._keys(shape)
        for _ in range(self.max_conflicts + 1):
            try:
                rows = self._read(keys)
                view = self._view_text(shape, rows, reserve_tokens, self.tenant)
            except StoreUnavailableError:
                return self._without_store(session, at_ms, now_epoch_ms)
            generations = {key: generation for key, (_, generation) in zip(keys, rows)}
            try:
                answer: Dict[str, Any] = call(session.admit, at_ms, now_epoch_ms, view)
            except RetryledgerError as e:
                if e.code == "generation_regressed":
                    # The store lost state the run has already seen.
                    return self._without_store(session, at_ms, now_epoch_ms)
                raise
            writes = answer["writes"]
            # The budget first: when a later breaker write conflicts, the
            # re-admission spends or deposits again (bounded by max_conflicts),
            # whereas a probe reserved in a breaker and then abandoned would
            # hold the half-open breaker's probe slot.
            try:
                written = True
                budget = writes.get("budget")
                if budget is not None:
                    key = self.budget_key(budget["scope"])
                    written = cas(key, generations.get(key, 0), budget)
                if written:
                    for snapshot in writes["breakers"]:
                        key = self.breaker_key(snapshot["route_release_sha256"])
                        if not cas(key, generations.get(key, 0), snapshot):
                            written = False
                            break
                if written:
                    for snapshot in writes.get("admission", ()):
                        key = self._admission_key_of(snapshot)
                        if not cas(key, generations.get(key, 0), snapshot):
                            written = False
                            break
            except StoreUnavailableError:
                return self._without_store(session, at_ms, now_epoch_ms)
            if written:
                return answer
            self.conflicts += 1
        raise _conflict("admission", self.max_conflicts + 1)

    def _without_store(self, session: _core.Session, at_ms: int, now_epoch_ms: int) -> Dict[str, Any]:
        self.unavailable += 1
        # The store may come back without what it held (a restart): read again.
        self._cache.clear()
        answer: Dict[str, Any] = call(session.admit, at_ms, now_epoch_ms, _UNAVAILABLE)
        return answer

    def record(
        self,
        session: _core.Session,
        policy: Policy,
        now_epoch_ms: int,
        route_release_sha256: Optional[str] = None,
    ) -> Optional[Dict[str, Any]]:
        """Record the last observed attempt's outcome in its route's breaker
        (``session.breaker_after`` of the cached snapshot, one check-and-set;
        on a conflict, again from the snapshot the store answered; a store
        without ``check_and_set_raw``: read, record, compare-and-set). ``route_release_sha256`` is that attempt's route release
        (read from the session when not given). Returns the snapshot written,
        or ``None`` when the policy has no breaker, no attempt was observed,
        or the store is unavailable (the outcome is then not counted)."""
        if not self._shape(policy).breaker:
            return None
        release = route_release_sha256
        if release is None:
            attempts = session.attempts["attempts"]
            if not attempts:
                return None
            release = str(attempts[-1]["route_release_sha256"])
        key = self.breaker_key(release)
        check_and_set = getattr(self.store, "check_and_set_raw", None)
        if check_and_set is None:
            return self._record_by_reads(session, key, release, now_epoch_ms)
        try:
            if key not in self._cache:
                self._refresh([key], self._read([key]))
        except StoreUnavailableError:
            self.unavailable += 1
            self._cache.clear()
            return None
        cache = self._cache
        for _ in range(self.max_conflicts + 1):
            text, generation = cache.get(key, _ABSENT)
            try:
                nxt: Dict[str, Any] = call(
                    session.breaker_after,
                    text if text is not None else to_text(fresh_breaker(release, now_epoch_ms)),
                    now_epoch_ms,
                )
            except RetryledgerError as e:
                if e.code == "generation_regressed":
                    self.unavailable += 1
                    return None
                raise
            entries: List[Entry] = [(key, generation, to_text(nxt))]
            try:
                ok, current = check_and_set(entries)
            except StoreUnavailableError:
                self.unavailable += 1
                self._cache.clear()
                return None
            if ok:
                self._written(entries)
                self.records += 1
                return nxt
            self.conflicts += 1
            self._refresh([key], current)
        raise _conflict("breaker record", self.max_conflicts + 1)

    def _record_by_reads(
        self, session: _core.Session, key: str, release: str, now_epoch_ms: int
    ) -> Optional[Dict[str, Any]]:
        """A breaker record with a store that has only ``get`` and
        ``compare_and_set`` (read, record, compare-and-set; re-read on a conflict)."""
        for _ in range(self.max_conflicts + 1):
            try:
                current, generation = self._read([key])[0]
            except StoreUnavailableError:
                self.unavailable += 1
                return None
            if current is None:
                current = to_text(fresh_breaker(release, now_epoch_ms))
            try:
                nxt: Dict[str, Any] = call(session.breaker_after, current, now_epoch_ms)
            except RetryledgerError as e:
                if e.code == "generation_regressed":
                    self.unavailable += 1
                    return None
                raise
            try:
                ok = self._cas(key, generation, nxt)
            except StoreUnavailableError:
                self.unavailable += 1
                return None
            if ok:
                self.records += 1
                return nxt
            self.conflicts += 1
        raise _conflict("breaker record", self.max_conflicts + 1)

    def release(
        self,
        session: _core.Session,
        policy: Policy,
        now_epoch_ms: int,
        route_release_sha256: str,
        used_tokens: Optional[int] = None,
        headers: Optional[Sequence[Tuple[str, str]]] = None,
    ) -> Optional[Dict[str, Any]]:
        """Free the in-flight slot of the session's admitted attempt (the one
        admitted and not yet observed, else the last one observed),
        settle its reserved tokens with ``used_tokens`` and apply the
        rate-limit ``headers`` its response carried (``(name, value)`` pairs;
        the same write: a lower ``remaining`` lowers the route's bucket, an
        exhausted one with a reset empties it until the reset) (``session.admission_release``
        of the cached snapshot, one check-and-set; on a conflict again from
        the snapshot the store answered). Called once the attempt is over,
        whatever its end (answer, error, cancellation, or admitted and never
        dispatched). Returns the snapshot written, or ``None`` when the
        policy has no admission limits, the attempt was admitted without
        them (``fail_open``), or the store is unavailable (the slot is then
        held: docs/FLEET.md)."""
        shape = self._shape(policy)
        if not shape.admission:
            return None
        key = self.admission_key(route_release_sha256, shape.scoped)
        check_and_set = getattr(self.store, "check_and_set_raw", None)
        cache = self._cache
        seen = json.dumps([[n, v] for n, v in headers]) if headers else None
        for _ in range(self.max_conflicts + 1):
            try:
                if check_and_set is None or key not in cache:
                    self._refresh([key], self._read([key]))
            except StoreUnavailableError:
                self.unavailable += 1
                self._cache.clear()
                return None
            text, generation = cache.get(key, _ABSENT)
            if text is None:
                # The store lost the key that admitted the attempt: nothing to free.
                self.unavailable += 1
                return None
            try:
                nxt: Dict[str, Any] = call(session.admission_release, text, now_epoch_ms, used_tokens, seen)
            except RetryledgerError as e:
                if e.code == "admission_missing":
                    return None
                raise
            try:
                if check_and_set is None:
                    ok = self._cas(key, generation, nxt)
                    current: List[Row] = []
                else:
                    entries: List[Entry] = [(key, generation, to_text(nxt))]
                    ok, current = check_and_set(entries)
            except StoreUnavailableError:
                self.unavailable += 1
                self._cache.clear()
                return None
            if ok:
                self._written([(key, generation, to_text(nxt))])
                self.releases += 1
                return nxt
            self.conflicts += 1
            if current:
                self._refresh([key], current)
            else:
                cache.pop(key, None)
        raise _conflict("admission release", self.max_conflicts + 1)

    def forget(self) -> None:
        """Drop the cached documents (the next admission reads its keys again).
        Never needed for correctness: a stale cache only costs a conflict."""
        self._cache.clear()

    def uses(self, policy: Policy) -> bool:
        """Whether the policy has a fleet section (a section of key pools
        alone too). The drivers admit only then, and the core refuses a fleet
        given to a policy without one (``admission_unexpected``)."""
        shape = self._shape(policy)
        return shape.breaker or shape.scope is not None or shape.admission or "key_pools" in (policy.document.get("fleet") or {})

    def limits(self, policy: Policy) -> bool:
        """Whether the policy has admission limits (each admitted attempt is
        then released with :meth:`release`)."""
        return self._shape(policy).admission


#: The request fields that bound the tokens a response may make, in the order they are looked for.
_OUTPUT_BOUNDS = ("max_completion_tokens", "max_output_tokens", "max_tokens")


def _output_bound(holder: Any) -> Optional[int]:
    if holder is None:
        return None
    for name in _OUTPUT_BOUNDS:
        value = holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def request_token_bound(params: Any, input_tokens: Optional[int] = None) -> int:
    """The tokens a request reserves under a token bucket (the run option
    ``reserve_tokens``): its output bound (``max_completion_tokens``,
    ``max_output_tokens`` or ``max_tokens`` of an OpenAI or Anthropic
    request; ``config.max_output_tokens`` of a ``google-genai`` one) plus its
    input: ``input_tokens`` when the caller counted them, else an estimate of
    one token per 4 characters of the request's JSON (an over-estimate for
    prose; the release settles the reservation with the usage the response
    reports). Raises ``ValueError`` for a request without an output bound."""
    bound = _output_bound(params)
    if bound is None:
        config = params.get("config") if isinstance(params, dict) else getattr(params, "config", None)
        bound = _output_bound(config)
    if bound is None:
        raise ValueError(
            "the request has no output bound (max_completion_tokens, max_output_tokens, max_tokens or "
            "config.max_output_tokens): pass reserve_tokens"
        )
    if input_tokens is None:
        text = json.dumps(params, default=str, ensure_ascii=False)
        input_tokens = -(-len(text) // 4)
    return check_integer("reserve_tokens", bound + check_integer("input_tokens", input_tokens))
