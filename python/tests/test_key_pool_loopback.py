"""A pool of four keys against a provider on 127.0.0.1 (docs/FLEET.md, "Key
pools"): one key is revoked (401), one is rate limited (429 with a
Retry-After hint of 4 s, longer than the policy's 2 s cap, so its run retries
before the key has cooled), two are healthy. Runs one after another on the
run machine, their pool state in a real store (memory, SQLite, Redis,
PostgreSQL): the revoked key is never sent again, the limited one not before
its hint (a last run finds the two healthy keys limited too, and only then
goes back to it), the keys are taken in turn (never one drained after
another), and no secret appears in any stored row, journal event or bundle.
The revoked key's 401 does not end its run: the run goes on at once with
another key of the pool, and each attempt records its key by digest. A pool
whose every key is refused ends its run sealed, ``stop_no_usable_key``."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from retryledger._loop import Machine, pump, run_loop
from retryledger.keypool import KeyRing, PooledStep, _Pooled, pool_config, run_pooled

from conftest import KEY, make_policy
from fleet_support import database_url, make_store, namespace

SECRETS = ["sk-live-revoked-0001", "sk-live-limited-0002", "sk-live-healthy-0003", "sk-live-healthy-0004"]
REVOKED, LIMITED = SECRETS[0], SECRETS[1]
HINT_S = 4


class Provider:
    """A provider that authenticates the bearer key of each request: the
    revoked key gets 401 every time, the limited key 429 with
    ``Retry-After: 4`` on its first use, every other use 200; once
    ``squeeze`` is set, each healthy key gets one 429 with ``Retry-After: 3``
    (longer than the policy's 2 s cap on a wait: the run's retry does not
    wait it out and moves on).
    Every request is kept with its key and arrival (monotonic seconds)."""

    def __init__(self) -> None:
        self.seen: List[Tuple[str, float, int]] = []
        self.squeeze = False
        self.squeezed: List[str] = []
        self.lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                key = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                with provider.lock:
                    used_before = any(k == key for k, _, _ in provider.seen)
                    if key == REVOKED:
                        status, headers = 401, {}
                    elif key == LIMITED and not used_before:
                        status, headers = 429, {"Retry-After": str(HINT_S)}
                    elif key in SECRETS[2:] and provider.squeeze and key not in provider.squeezed:
                        provider.squeezed.append(key)
                        status, headers = 429, {"Retry-After": "3"}
                    elif key in SECRETS:
                        status, headers = 200, {}
                    else:
                        status, headers = 401, {}
                    provider.seen.append((key, arrived, status))
                body = json.dumps({"ok": status == 200}).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server name
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/chat"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Provider":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class HTTPStatus(Exception):
    """An HTTP error answer: its status and headers (what the classifier reads)."""

    def __init__(self, status: int, headers: Dict[str, str]) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.headers = headers


def call(url: str, step: PooledStep) -> Dict[str, Any]:
    assert step.api_key is not None, "every route of the policy takes its key from the pool"
    request = urllib.request.Request(
        url,
        data=b'{"messages":[]}',
        headers={"Authorization": f"Bearer {step.api_key}", "Idempotency-Key": step.idempotency_key},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            answer: Dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as e:
        raise HTTPStatus(e.code, dict(e.headers.items())) from None


def pooled_policy(ring: KeyRing) -> Dict[str, Any]:
    pool = pool_config("provider-keys", ring, cool_ms=1_000, park_ms=60_000)
    policy = make_policy(fleet={"key_pools": [pool], "on_store_unavailable": "fail_closed"})
    for route in policy["routes"]:
        route["key_pool"] = "provider-keys"
    return policy


def stored_texts(backend: str, store: Any, tmp: Path, ns: str, keys: List[str]) -> List[str]:
    """Every row the store holds for this test: the whole SQLite file (rows
    and bytes); every Redis key and PostgreSQL row of the test's namespace
    (registers and logs); the registers the runs wrote."""
    texts: List[str] = []
    if backend == "redis":
        client = store.client
        for name in client.scan_iter(match=f"*{ns}*"):
            kind = client.type(name)
            kind = kind.decode() if isinstance(kind, bytes) else kind
            value = client.hgetall(name) if kind == "hash" else client.get(name)
            texts.append(repr(value))
        assert texts, "the namespace's Redis keys"
    if backend == "postgres":
        import psycopg

        with psycopg.connect(database_url()) as conn:
            for query in (
                "SELECT * FROM retryledger_register WHERE key LIKE %s",
                "SELECT * FROM retryledger_log WHERE log LIKE %s",
            ):
                rows = conn.execute(query, (f"{ns}%",)).fetchall()
                assert rows, query
                texts.extend(repr(row) for row in rows)
    if backend == "sqlite":
        db = sqlite3.connect(tmp / "fleet.sqlite3")
        for table in ("retryledger_register", "retryledger_log"):
            texts.extend(repr(row) for row in db.execute(f"SELECT * FROM {table}"))
        db.close()
        texts.append((tmp / "fleet.sqlite3").read_bytes().decode("latin-1"))
    for key in keys:
        document, _ = store.get(f"{ns}/{key}")
        texts.append(json.dumps(document))
    return texts


@pytest.mark.parametrize("backend", ["memory", "sqlite", "redis", "postgres"])
def test_four_keys_one_revoked_one_limited(backend: str, tmp_path: Path) -> None:
    store = make_store(backend, tmp_path)
    ns = namespace()
    ring = KeyRing(SECRETS)
    policy = pooled_policy(ring)
    documents: List[str] = []
    terminals: List[str] = []
    with Provider() as provider:

        def one_run() -> None:
            result = run_pooled(
                policy,
                lambda step: call(provider.url, step),
                KEY,
                store=store,
                keys=ring,
                namespace=ns,
                sleep=lambda ms: time.sleep(ms / 1000),
            )
            terminals.append(result.terminal)
            documents.append(result.bundle_json)
            documents.append(json.dumps(result.bundle))

        for _ in range(6):
            one_run()
        in_turn = len(provider.seen)
        # The two healthy keys are limited in turn: the run goes back to the
        # limited key, once its hint has passed.
        provider.squeeze = True
        one_run()
        # A journaled run: its events go to the store's log.
        log = f"{ns}-journal"
        journal = _journaled_run(store, ring, policy, provider.url, ns, log)
        documents.extend(journal)
        seen = list(provider.seen)

    keys = [k for k, _, _ in seen]
    # The first run takes the first key, is refused (401) and goes on at
    # once with another key of the pool: every run completes.
    assert all(t == "completed" for t in terminals), terminals
    assert keys[0] == REVOKED and keys[1] != REVOKED
    assert seen[1][1] - seen[0][1] < 1.0, "no backoff after a refused key"
    first_bundle = json.loads(documents[0])
    first_attempts = first_bundle["attempts"]["attempts"]
    assert first_attempts[0]["key_refused"] == "unauthorized"
    assert first_attempts[0]["admission"]["key"]["key_sha256"] == ring.digest_of(REVOKED)
    assert [a["admission"]["key"]["key_sha256"] for a in first_attempts] == [
        ring.digest_of(k) for k in keys[: len(first_attempts)]
    ], "each attempt records the key it was sent with"
    assert first_bundle["receipt"]["schedule"][0]["key_sha256"] == ring.digest_of(REVOKED)
    assert "fleet_stop" not in first_bundle["attempts"]
    # The squeezed run: a healthy key limited, then the key least recently
    # touched (the other healthy key, limited in its turn, or the limited
    # key again, its hint long past) until one answers; no key twice.
    squeezed = seen[in_turn:]
    end = next(i for i, (_, _, status) in enumerate(squeezed) if status == 200)
    assert 1 <= end <= 2, squeezed
    assert all(status == 429 and key in SECRETS[2:] for key, _, status in squeezed[:end]), squeezed
    assert len({key for key, _, _ in squeezed[: end + 1]}) == end + 1, "a key asked twice in one run"
    # The revoked key: used once, never again.
    first_401 = next(i for i, (k, _, s) in enumerate(seen) if k == REVOKED and s == 401)
    assert REVOKED not in keys[first_401 + 1 :], "the revoked key is never sent again"
    # The limited key: sent again, and not before its hint.
    limited_at = next(at for k, at, s in seen if k == LIMITED and s == 429)
    again = [at for k, at, _ in seen if k == LIMITED and at > limited_at]
    assert again, "the limited key is used again once it has cooled"
    assert min(again) >= limited_at + HINT_S, "the limited key is not sent before its hint"
    # In turn: the first four requests use four keys, no key is sent twice
    # in a row, and the healthy keys share the load.
    first = keys[:in_turn]
    assert sorted(first[:4]) == sorted(SECRETS), first
    assert all(a != b for a, b in zip(first, first[1:])), "a key drained one request after another"
    healthy = [first.count(s) for s in SECRETS[2:]]
    assert max(healthy) - min(healthy) <= 1, f"the healthy keys share the load: {healthy}"

    # No secret in any document: rows, journal, bundles.
    rows = stored_texts(backend, store, tmp_path, ns, ["key_pool/provider-keys"])
    assert any("disabled" in r for r in rows), "the pool's state is in the store"
    for text in documents + rows:
        for secret in SECRETS:
            assert secret not in text
    for secret in SECRETS:
        assert ring.digest_of(secret) in "".join(rows), "a key is named by its digest"


def _journaled_run(store: Any, ring: KeyRing, policy: Dict[str, Any], url: str, ns: str, log: str) -> List[str]:
    """A pooled run with a journal appended to the store's log ``log``: its
    events as the store holds them."""

    class Journaled(_Pooled):
        def append(self, events: List[Dict[str, Any]]) -> bool:
            for event in events:
                got = store.append(log, int(event["seq"]), json.dumps(event, sort_keys=True))
                if not got.ok:
                    return False
            return True

    adapter = Journaled(
        lambda step: call(url, step), KEY, store, ring, ns, None, lambda: time.time() * 1000, lambda ms: time.sleep(ms / 1000)
    )
    machine = Machine.start(
        policy, {"origin_epoch_ms": adapter.origin, "journal": {"run_id": "pooled-run", "lease_generation": 1}}
    )
    result = pump(run_loop(machine, adapter), adapter)
    assert result.terminal == "completed"
    events = [entry.text for entry in store.read(log)]
    assert len(events) >= 4 and adapter.sent and adapter.sent[0] is not None
    return events + [result.bundle_json]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_every_key_refused_ends_the_run_sealed(backend: str, tmp_path: Path) -> None:
    """Three keys the provider refuses (401): the run sends each once, in
    turn and without a backoff, then ends sealed with ``stop_no_usable_key``
    (its bundle verifies and keeps the three attempts, each naming its key by
    digest); the next run sends nothing and ends the same way."""
    import retryledger

    store = make_store(backend, tmp_path)
    ns = namespace()
    gone = [REVOKED, "sk-live-gone-0005", "sk-live-gone-0006"]
    ring = KeyRing(gone)
    policy = pooled_policy(ring)
    with Provider() as provider:
        runs = [
            run_pooled(policy, lambda step: call(provider.url, step), KEY, store=store, keys=ring, namespace=ns)
            for _ in range(2)
        ]
        seen = list(provider.seen)
    assert [s for _, _, s in seen] == [401, 401, 401]
    assert sorted(k for k, _, _ in seen) == sorted(gone), "each key once"
    first, second = runs
    assert first.terminal == second.terminal == "stop_no_usable_key"
    attempts = first.bundle["attempts"]["attempts"]
    assert [a["admission"]["key"]["key_sha256"] for a in attempts] == [ring.digest_of(k) for k, _, _ in seen]
    assert [a["key_refused"] for a in attempts] == ["unauthorized"] * 3
    assert [a["route_ordinal"] for a in attempts] == [1, 1, 1], "a refused key spends no route attempt"
    stop = first.bundle["attempts"]["fleet_stop"]
    assert stop["reason"] == "no_usable_key" and stop["key_pool"] == "provider-keys"
    assert second.bundle["attempts"]["attempts"] == []
    for run in runs:
        verdict = retryledger.verify_bundle(run.bundle)
        assert verdict["kind"] == "verified" and verdict["terminal"] == "stop_no_usable_key", verdict
        for secret in gone:
            assert secret not in run.bundle_json
    document, _ = store.get(f"{ns}/key_pool/provider-keys")
    assert document is not None, "the pool is in the store"
    assert [k["state"] for k in document["keys"]] == ["disabled"] * 3
    assert [k["reason"] for k in document["keys"]] == ["unauthorized"] * 3


def test_a_digest_the_ring_does_not_hold_is_coded() -> None:
    ring = KeyRing(SECRETS[:2])
    with pytest.raises(Exception) as e:
        ring.secret("0" * 64)
    assert getattr(e.value, "code", None) == "key_not_in_pool"
    assert "sk-" not in repr(ring)


def test_a_plain_fleet_run_refuses_a_pooled_policy() -> None:
    """The session drivers do not select keys: a pooled policy there is a
    coded refusal before anything is sent, never a run without its pool."""
    import retryledger
    from retryledger.fleet import Fleet
    from retryledger.stores import MemoryStore

    sent: List[str] = []
    policy = pooled_policy(KeyRing(SECRETS))
    with pytest.raises(Exception) as e:
        retryledger.run(policy, lambda step: sent.append("sent"), KEY, fleet=Fleet(MemoryStore()))
    assert getattr(e.value, "code", None) == "machine_layer_missing"
    assert sent == []
