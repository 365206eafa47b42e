"""Shared by the receiver guard's tests: an endpoint that counts its runs, served
on 127.0.0.1 (port 0) behind the guard, either as a pure ASGI app under uvicorn
(:class:`IdempotencyMiddleware`) or as a decorated handler under the standard
library's ``ThreadingHTTPServer`` (:meth:`IdempotencyGuard.handler`)."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, MutableMapping, Optional, Tuple

import uvicorn

from retryledger.receiver import HttpRequest, HttpResponse, IdempotencyGuard, IdempotencyMiddleware, NoEffect
from retryledger.stores import StoreUnavailableError

RETENTION = {"expired": "reject", "poll_after_ms": 2500, "ttl_ms": 60_000}


class Endpoint:
    """The guarded work: ``/orders`` answers 201 with the order and how many
    runs came before; ``/slow`` waits for :attr:`gate` first; ``/boom``
    raises (``/boom?no_effect=1``: :class:`NoEffect`); ``/down`` answers 503; ``/big`` answers
    a body of ``size`` bytes from the query."""

    def __init__(self) -> None:
        self.runs: List[Tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def run(self, target: str, body: bytes) -> HttpResponse:
        with self.lock:
            self.runs.append((target, body))
            n = len(self.runs)
        path, _, query = target.partition("?")
        if path == "/slow":
            self.entered.set()
            assert self.gate.wait(30), "the gate was never opened"
        if path == "/boom":
            if query == "no_effect=1":
                raise NoEffect("refused before any change")
            raise RuntimeError("failed after the charge")
        if path == "/down":
            return HttpResponse(503, [("content-type", "text/plain")], b"busy")
        if path == "/big":
            return HttpResponse(200, [("content-type", "application/octet-stream")], b"x" * int(query.split("=")[1]))
        payload = json.dumps({"order": json.loads(body or b"null"), "run": n}).encode()
        return HttpResponse(201, [("Content-Type", "application/json"), ("Location", f"/orders/{n}"), ("X-Dropped", "1")], payload)

    def count(self, path: str) -> int:
        with self.lock:
            return sum(1 for t, _ in self.runs if t.split("?")[0] == path)


class Reply:
    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Server:
    """A guarded endpoint on 127.0.0.1; ``post`` sends one request."""

    port: int

    def post(self, path: str, body: bytes, key: Optional[str] = None, method: str = "POST") -> Reply:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        out = Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
        conn.close()
        return out

    def close(self) -> None:
        raise NotImplementedError


class AsgiServer(Server):
    """The endpoint as a pure ASGI app behind :class:`IdempotencyMiddleware`, under uvicorn."""

    def __init__(self, guard: IdempotencyGuard, endpoint: Endpoint) -> None:
        async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
            assert scope["type"] == "http"
            body = b""
            while True:
                m = await receive()
                body += m.get("body", b"")
                if not m.get("more_body"):
                    break
            query = scope["query_string"].decode()
            target = scope["path"] + (f"?{query}" if query else "")
            response = await asyncio.to_thread(endpoint.run, target, body)
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [(k.encode(), v.encode()) for k, v in response.headers],
                }
            )
            await send({"type": "http.response.body", "body": response.body})

        config = uvicorn.Config(
            IdempotencyMiddleware(app, guard), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class DecoratedServer(Server):
    """The endpoint as a handler decorated by :meth:`IdempotencyGuard.handler`,
    under ``ThreadingHTTPServer``."""

    def __init__(self, guard: IdempotencyGuard, endpoint: Endpoint) -> None:
        @guard.handler
        def handle(request: HttpRequest) -> HttpResponse:
            return endpoint.run(request.target, request.body)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    response = handle(HttpRequest(self.command, self.path, headers, body))
                except Exception:
                    response = HttpResponse(500, [("content-type", "text/plain")], b"handler failed")
                self.send_response(response.status)
                for k, v in response.headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(response.body)))
                self.end_headers()
                self.wfile.write(response.body)

            do_PUT = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class SwitchableStore:
    """A memory store that can be switched off: every call then raises
    :class:`StoreUnavailableError`, as a backend that cannot be reached does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        if self.down:
            raise StoreUnavailableError("switched off")
        result: Tuple[Optional[Dict[str, Any]], int] = self.inner.get(key)
        return result

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        if self.down:
            raise StoreUnavailableError("switched off")
        result: Tuple[bool, int] = self.inner.compare_and_set(key, expected_generation, document)
        return result
