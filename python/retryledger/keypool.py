"""Key pools on the run machine: a route that names a pool of the fleet
section's ``key_pools`` has the key of each attempt chosen by the core, from
the pool's state in a register store (``key_pool/<name>``), and the answer
recorded there by compare-and-set (docs/FLEET.md, "Key pools").

The host holds the secrets; the core and every document hold only their
SHA-256 digests. :class:`KeyRing` is the host's list of secrets, looked up
by digest when a dispatch names one; :func:`pool_config` builds a pool's
configuration from it (digests only). :func:`run_pooled` drives one run
through the host loop: it reads and writes the store as the machine asks,
sleeps until each attempt's time, and calls ``dispatch`` with a
:class:`PooledStep` whose ``api_key`` is the secret to send. It decides
nothing: which key, when, and what an answer does to a key are the core's.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, TypeVar, Union

from ._api import Document, Policy, key_sha256
from ._driver import Classifier, MachineStep, _checked, _sleep_ms, _wall_ms
from ._errors import PolicyError
from ._loop import Adapter, Machine, pump, run_loop, store_read, store_write

__all__ = ["KeyRing", "PooledStep", "PooledResult", "pool_config", "run_pooled"]

T = TypeVar("T")


class KeyRing:
    """The host's API keys, by the digest the core names them with. The
    secrets stay here: ``repr`` and every document show digests only."""

    __slots__ = ("_by_digest", "_order")

    def __init__(self, secrets: Iterable[str]) -> None:
        self._by_digest: Dict[str, str] = {}
        self._order: List[str] = []
        for secret in secrets:
            digest = key_sha256(secret)
            if digest not in self._by_digest:
                self._order.append(digest)
            self._by_digest[digest] = secret

    @property
    def digests(self) -> List[str]:
        """The keys' digests, in the order given."""
        return list(self._order)

    def digest_of(self, secret: str) -> str:
        """The digest of a secret this ring holds."""
        digest = key_sha256(secret)
        if digest not in self._by_digest:
            raise PolicyError("key_not_in_pool", "the key ring does not hold this secret", "/keys")
        return digest

    def secret(self, digest: str) -> str:
        """The secret of a digest; ``key_not_in_pool`` when the ring does not hold it."""
        try:
            return self._by_digest[digest]
        except KeyError:
            raise PolicyError(
                "key_not_in_pool", f"the core chose key {digest}, which the host's key ring does not hold", "/key/key_sha256"
            ) from None

    def __repr__(self) -> str:
        return f"KeyRing({len(self._order)} keys)"


def pool_config(
    name: str,
    keys: KeyRing,
    *,
    cool_ms: int,
    park_ms: int,
    accounts: Optional[Mapping[str, str]] = None,
    disable_ms: Optional[int] = None,
) -> Dict[str, Any]:
    """A pool's configuration (the fleet section's ``key_pools`` entry) of
    every key of ``keys``: digests only. ``accounts`` maps a key's digest to
    the account whose quota it draws on (keys of one account cool and park
    together). ``disable_ms`` bounds how long a refused key (401, 403) stays
    disabled; ``None``: until the configuration changes. The core checks it
    when the policy is compiled."""
    entries: List[Dict[str, Any]] = []
    for digest in keys.digests:
        entry: Dict[str, Any] = {"key_sha256": digest}
        if accounts is not None and digest in accounts:
            entry["account"] = accounts[digest]
        entries.append(entry)
    config: Dict[str, Any] = {"cool_ms": cool_ms, "keys": entries, "name": name, "park_ms": park_ms}
    if disable_ms is not None:
        config["disable_ms"] = disable_ms
    return config


class PooledStep(MachineStep):
    """An attempt of a pooled run: :class:`~retryledger.Step` plus the key
    to send it with (``api_key``; ``None`` on a route without a pool) and
    its digest."""

    def __init__(self, effect: Mapping[str, Any], idempotency_key: str, keys: KeyRing) -> None:
        super().__init__(effect, idempotency_key)
        chosen = effect.get("key")
        #: The digest of the key to send with (``None``: the route has no pool).
        self.key_sha256: Optional[str] = None if chosen is None else str(chosen["key_sha256"])
        #: The pool the key is of.
        self.key_pool: Optional[str] = None if chosen is None else str(chosen["pool"])
        #: The secret to send (``None``: the route has no pool).
        self.api_key: Optional[str] = None if self.key_sha256 is None else keys.secret(self.key_sha256)


class PooledResult(NamedTuple):
    """A pooled run: the value of the attempt that completed it (``None``
    otherwise), the receipt and its digest, the bundle, and the digest of
    the key each attempt was sent with (``None`` without a pool)."""

    value: Any
    receipt: Dict[str, Any]
    receipt_sha256: str
    bundle: Dict[str, Any]
    bundle_json: str
    keys: List[Optional[str]]

    @property
    def terminal(self) -> str:
        """How the run ended."""
        return str(self.receipt["terminal"])


class _Pooled(Adapter):
    """The host loop's adapter of a pooled run: the store's registers, the
    wall clock, the caller's dispatch with the key the core chose."""

    def __init__(
        self,
        dispatch: Callable[[PooledStep], Any],
        idempotency_key: str,
        store: Any,
        keys: KeyRing,
        namespace: str,
        classify: Optional[Classifier],
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.calls = dispatch
        self.idempotency_key = idempotency_key
        self.store = store
        self.keys = keys
        self.namespace = namespace
        self.classify = classify
        self.clock = clock
        self.pause = sleep
        self.origin = max(0, int(clock()))
        self.sent: List[Optional[str]] = []
        self.step: Optional[PooledStep] = None

    def now_ms(self) -> int:
        return max(0, int(self.clock()) - self.origin)

    def sleep(self, ms: int) -> Any:
        return self.pause(ms)

    def dispatch(self, effect: Dict[str, Any]) -> Any:
        step = PooledStep(effect, self.idempotency_key, self.keys)
        self.step = step
        self.sent.append(step.key_sha256)
        return self.calls(step)

    def observation(self, effect: Dict[str, Any], ok: bool, reply: Any) -> Dict[str, Any]:
        step = self.step
        if step is None:
            step = PooledStep(effect, self.idempotency_key, self.keys)
        return step.observation(ok, reply, self.classify, max(0, int(self.clock())))

    def read(self, keys: List[str]) -> List[Dict[str, Any]]:
        return store_read(self.store, self.namespace, keys)

    def write(self, writes: List[Dict[str, Any]]) -> int:
        return store_write(self.store, self.namespace, writes)


def run_pooled(
    policy: Union[Policy, Document],
    dispatch: Callable[[PooledStep], T],
    idempotency_key: str,
    *,
    store: Any,
    keys: KeyRing,
    namespace: str = "retryledger",
    key_affinity: Optional[str] = None,
    classify: Optional[Classifier] = None,
    clock: Optional[Callable[[], float]] = None,
    sleep: Optional[Callable[[float], None]] = None,
    max_conflicts: Optional[int] = None,
) -> PooledResult:
    """Run one logical request on the run machine with its fleet state in
    ``store`` (a register store: ``get`` and ``compare_and_set``; keys under
    ``namespace``): each attempt on a pooled route is sent with the key the
    core chose, ``step.api_key``. ``key_affinity`` is the digest of the key
    the caller's session used before (kept while usable). ``clock`` is the
    wall clock in Unix ms, ``sleep`` takes ms. A store that cannot be read
    raises :class:`~retryledger.stores.StoreUnavailableError` and the
    policy's ``on_store_unavailable`` decides. A 401 or 403 disables the key
    and the run goes on with another key of the pool; a pool with no usable
    key (every key refused, or none before the deadline) ends the run sealed
    with the terminal ``stop_no_usable_key`` (the attempts before it in the
    bundle, each naming its key by digest). Writes that keep conflicting
    raise ``store_conflict``. The idempotency key must be the
    one whose digest the policy carries."""
    compiled = _checked(policy, idempotency_key)
    wall = _wall_ms if clock is None else clock
    adapter = _Pooled(dispatch, idempotency_key, store, keys, namespace, classify, wall, _sleep_ms if sleep is None else sleep)
    options: Dict[str, Any] = {"origin_epoch_ms": adapter.origin}
    if key_affinity is not None:
        options["key_affinity"] = key_affinity
    if max_conflicts is not None:
        options["max_conflicts"] = max_conflicts
    machine = Machine.start(compiled, options)
    result = pump(run_loop(machine, adapter), adapter)
    return PooledResult(
        result.value, result.receipt, result.receipt_sha256, result.bundle, result.bundle_json, adapter.sent
    )
