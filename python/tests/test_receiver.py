"""The receiver guard over loopback HTTP (127.0.0.1): a pure ASGI app under
uvicorn and a decorated handler under ``ThreadingHTTPServer``, with records
in the memory, SQLite and PostgreSQL stores. Replays (marked, the handler
ran once), conflicts (409 with Retry-After while in progress), rejects (422
for another body under the key), 400 without a key, 503 when the store is
down (the handler never runs)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from retryledger.receiver import (
    HttpRequest,
    HttpResponse,
    IdempotencyGuard,
    http_request_sha256,
    http_response_sha256,
)
from retryledger.stores import MemoryStore, PostgresStore, SQLiteStore

from fleet_support import database_url, namespace
from receiver_support import RETENTION, AsgiServer, DecoratedServer, Endpoint, Server, SwitchableStore

BACKENDS = ["memory", "sqlite", "postgres"]
FRONTS = ["asgi", "decorator"]


class Rig:
    def __init__(self, front: str, backend: str, tmp: Path, **guard: Any) -> None:
        self.endpoint = Endpoint()
        self.backend = backend
        if backend == "memory":
            self.store: Any = SwitchableStore(MemoryStore())
        elif backend == "sqlite":
            self.store = SQLiteStore(tmp / "receiver.sqlite3")
        else:
            self.store = PostgresStore(database_url())
        guard.setdefault("retention", RETENTION)
        self.guard = IdempotencyGuard(self.store, prefix=f"{namespace()}/idempotency/", **guard)
        self.server: Server = (AsgiServer if front == "asgi" else DecoratedServer)(self.guard, self.endpoint)

    def close(self) -> None:
        self.server.close()


@pytest.fixture(params=[(f, b) for b in BACKENDS for f in FRONTS], ids=lambda p: f"{p[0]}-{p[1]}")
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    front, backend = request.param
    r = Rig(front, backend, tmp_path)
    yield r
    r.close()


ORDER = json.dumps({"sku": "A-1", "qty": 2}).encode()


def test_same_key_and_body_replays_the_stored_response_and_runs_once(rig: Rig) -> None:
    first = rig.server.post("/orders", ORDER, key="order-1")
    assert first.status == 201
    assert "idempotent-replayed" not in first.headers
    second = rig.server.post("/orders", ORDER, key="order-1")
    assert second.status == 201
    assert second.headers["idempotent-replayed"] == "true"
    assert second.body == first.body
    assert second.json() == {"order": {"qty": 2, "sku": "A-1"}, "run": 1}
    assert second.headers["location"] == "/orders/1"  # kept
    assert second.headers["content-type"] == "application/json"
    assert "x-dropped" not in second.headers  # not among the kept headers
    assert rig.endpoint.count("/orders") == 1
    # Another key is another request: it runs.
    assert rig.server.post("/orders", ORDER, key="order-2").json()["run"] == 2


def test_same_key_in_progress_is_409_with_retry_after(rig: Rig) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(rig.server.post, "/slow", ORDER, "slow-1")
        assert rig.endpoint.entered.wait(10)
        second = rig.server.post("/slow", ORDER, key="slow-1")
        assert second.status == 409
        assert second.headers["retry-after"] == "3"  # poll_after_ms 2500, in whole seconds up
        assert second.json()["code"] == "idempotency_in_progress"
        rig.endpoint.gate.set()
        assert first.result(30).status == 201
    third = rig.server.post("/slow", ORDER, key="slow-1")
    assert (third.status, third.headers["idempotent-replayed"]) == (201, "true")
    assert rig.endpoint.count("/slow") == 1


def test_same_key_another_body_is_422(rig: Rig) -> None:
    assert rig.server.post("/orders", ORDER, key="order-9").status == 201
    other = rig.server.post("/orders", b'{"sku":"A-1","qty":3}', key="order-9")
    assert other.status == 422
    assert other.json()["code"] == "idempotency_key_reuse"
    # Another path under the key is another request too.
    assert rig.server.post("/orders?x=1", ORDER, key="order-9").status == 422
    assert rig.endpoint.count("/orders") == 1


def test_missing_key_is_400_and_the_handler_does_not_run(rig: Rig) -> None:
    reply = rig.server.post("/orders", ORDER)
    assert reply.status == 400
    assert reply.json()["code"] == "idempotency_key_missing"
    bad = rig.server.post("/orders", ORDER, key="x" * 256)
    assert (bad.status, bad.json()["code"]) == (400, "idempotency_key_invalid")
    assert rig.endpoint.count("/orders") == 0


def test_store_down_is_503_and_the_handler_does_not_run(rig: Rig, tmp_path: Path) -> None:
    assert rig.server.post("/orders", ORDER, key="before").status == 201
    if rig.backend == "memory":
        rig.store.down = True
    elif rig.backend == "sqlite":
        rig.store.close()
    else:
        # Nothing listens on port 1: the same client, a server that cannot be reached.
        rig.guard.store = PostgresStore("postgresql://retryledger@127.0.0.1:1/retryledger", connect_timeout=1)
    for key in ("before", "after"):
        reply = rig.server.post("/orders", ORDER, key=key)
        assert reply.status == 503, reply.body
        assert reply.json()["code"] == "store_unavailable"
    assert rig.endpoint.count("/orders") == 1


def test_a_handler_that_raises_or_answers_5xx_is_indeterminate_unless_it_says_no_effect(rig: Rig) -> None:
    assert rig.server.post("/boom", b"{}", key="boom-1").status == 500
    again = rig.server.post("/boom", b"{}", key="boom-1")
    assert (again.status, again.json()["code"]) == (409, "idempotency_indeterminate")
    assert "retry-after" not in again.headers
    assert rig.endpoint.count("/boom") == 1
    # A server error's response is not a result to replay: indeterminate too.
    assert rig.server.post("/down", b"{}", key="down-1").status == 503
    down = rig.server.post("/down", b"{}", key="down-1")
    assert (down.status, down.json()["code"]) == (409, "idempotency_indeterminate")
    assert rig.endpoint.count("/down") == 1
    # NoEffect: failed_no_effect, so the same request runs again.
    for _ in range(2):
        assert rig.server.post("/boom?no_effect=1", b"{}", key="boom-2").status == 500
    assert rig.endpoint.count("/boom") == 3


def test_a_response_over_the_bound_is_kept_by_digest_only(tmp_path: Path) -> None:
    rig = Rig("asgi", "memory", tmp_path, max_response_bytes=1000)
    try:
        small = rig.server.post("/big?size=1000", b"", key="big-1")
        assert rig.server.post("/big?size=1000", b"", key="big-1").body == small.body
        large = rig.server.post("/big?size=1001", b"", key="big-2")
        assert (large.status, len(large.body)) == (200, 1001)
        replay = rig.server.post("/big?size=1001", b"", key="big-2")
        assert replay.status == 409
        assert replay.json()["code"] == "idempotency_response_not_kept"
        assert replay.headers["idempotent-replayed"] == "true"
        kept = [["content-type", "application/octet-stream"]]
        assert replay.headers["idempotency-result-sha256"] == http_response_sha256(200, kept, b"x" * 1001)
        assert rig.endpoint.count("/big") == 2
    finally:
        rig.close()


@pytest.mark.parametrize("expired", ["reject", "proceed"])
def test_an_expired_record_answers_as_the_retention_says(expired: str, tmp_path: Path) -> None:
    clock = [1_800_000_000_000]
    retention = {"expired": expired, "poll_after_ms": 1000, "ttl_ms": 10_000}
    rig = Rig("decorator", "memory", tmp_path, retention=retention, now_ms=lambda: clock[0])
    try:
        assert rig.server.post("/orders", ORDER, key="old").status == 201
        clock[0] += 10_000
        reply = rig.server.post("/orders", ORDER, key="old")
        if expired == "reject":
            assert (reply.status, reply.json()["code"]) == (422, "idempotency_key_expired")
            assert rig.endpoint.count("/orders") == 1
        else:
            assert (reply.status, reply.json()["run"]) == (201, 2)
            assert "idempotent-replayed" not in reply.headers
    finally:
        rig.close()


def test_the_record_is_the_cores_and_the_raw_key_is_never_stored() -> None:
    store = MemoryStore()
    guard = IdempotencyGuard(store, RETENTION, tenant="t-7", operation="orders.create", now_ms=lambda: 5_000)

    @guard.handler
    def handle(request: HttpRequest) -> HttpResponse:
        return HttpResponse(201, [("content-type", "text/plain")], b"ok")

    request = HttpRequest("post", "/orders", {"Idempotency-Key": "raw-key-1"}, b"{}")
    assert handle(request).status == 201
    key_sha = guard.key_sha256("raw-key-1")
    record, generation = store.get(guard.record_key(key_sha))
    assert generation == 2  # claimed (1), completed (2)
    assert record == {
        "created_at_epoch_ms": 5_000,
        "expires_at_epoch_ms": 65_000,
        "idempotency_key_sha256": key_sha,
        "request_sha256": http_request_sha256("POST", "/orders", b"{}"),
        "result_sha256": http_response_sha256(201, [["content-type", "text/plain"]], b"ok"),
        "schema": "retryledger.idempotency_record.v1",
        "status": "succeeded",
        "updated_at_epoch_ms": 5_000,
    }
    assert "raw-key-1" not in json.dumps(store.get(guard.response_key(key_sha))[0])
    # An unscoped guard over the same store does not see the scoped record.
    other = IdempotencyGuard(store, RETENTION, now_ms=lambda: 5_000)
    assert other.key_sha256("raw-key-1") != key_sha


def test_async_handler_and_an_optional_key() -> None:
    import asyncio

    runs: List[int] = []
    guard = IdempotencyGuard(MemoryStore(), RETENTION, required=False)

    @guard.handler
    async def handle(request: HttpRequest) -> HttpResponse:
        runs.append(1)
        return HttpResponse(200, [], b"done")

    async def main() -> List[HttpResponse]:
        keyed = HttpRequest("POST", "/x", {"idempotency-key": "k"}, b"")
        bare = HttpRequest("POST", "/x", {}, b"")
        return [await handle(keyed), await handle(keyed), await handle(bare), await handle(bare)]

    answers = asyncio.run(main())
    assert [a.header("Idempotent-Replayed") for a in answers] == [None, "true", None, None]
    assert len(runs) == 3  # the keyed request once, the unkeyed twice (no key, none required)


def test_the_request_digest_is_the_documented_one() -> None:
    body = b'{"sku":"A-1","qty":2}'
    literal = (
        '{"body_sha256":"%s","method":"POST","schema":"retryledger.http_request.v1","target":"/orders?dry=1"}'
        % hashlib.sha256(body).hexdigest()
    )
    expected = hashlib.sha256(literal.encode()).hexdigest()
    assert http_request_sha256("post", "/orders?dry=1", body) == expected
    # The value wasm/test/receiver.test.mjs pins too: both packages digest a request alike.
    assert expected == "8a7f9d9374aa551dfb55f63c66dcce78d5715443a8235ebbcbef523694282866"
    response = '{"body_sha256":"%s","headers":[["content-type","application/json"]],"schema":"retryledger.http_response.v1","status":201}' % (
        hashlib.sha256(b"{}").hexdigest()
    )
    assert http_response_sha256(201, [["content-type", "application/json"]], b"{}") == hashlib.sha256(
        response.encode()
    ).hexdigest()

