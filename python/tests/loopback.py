"""Fake providers on 127.0.0.1 (port 0) for the integration tests.

:class:`ScriptedServer` is a real ``ThreadingHTTPServer``: the first segment
of the path names the route, each route answers its script in order
(repeating the last reply), and every request is counted with its arrival
time, its ``Idempotency-Key`` and when its reply was sent.
:class:`HangUpServer` accepts TCP connections and closes them at once: a TLS
client fails its handshake there, a connect failure that the server counts.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple

#: (status, extra headers)
Reply = Tuple[int, Dict[str, str]]


class Request:
    def __init__(self, route: str, path: str, arrived: float, idempotency_key: Optional[str], body: bytes = b"") -> None:
        self.route = route
        self.path = path
        self.arrived = arrived
        self.idempotency_key = idempotency_key
        #: The request body as received.
        self.body = body


class ScriptedServer:
    """A scripted HTTP server; ``body(status)`` is the JSON document each reply carries."""

    def __init__(self, scripts: Dict[str, List[Reply]], body: Callable[[int], Any]) -> None:
        self.scripts = scripts
        self.requests: List[Request] = []
        self.replied: List[float] = []  # when each reply began to be written, in request order
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                received = self.rfile.read(length)
                route = self.path.split("/")[1]
                with server.lock:
                    index = sum(1 for r in server.requests if r.route == route)
                    server.requests.append(
                        Request(route, self.path, arrived, self.headers.get("Idempotency-Key"), received)
                    )
                    script = server.scripts[route]
                    status, headers = script[min(index, len(script) - 1)]
                payload = json.dumps(body(status)).encode()
                # Taken before the reply is written: the client cannot have
                # completed the attempt earlier, however late this thread runs.
                replying = time.monotonic()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                with server.lock:
                    server.replied.append(replying)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self._answer()

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self._answer()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    def base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def url(self, route: str) -> str:
        return f"{self.base()}/{route}"

    def count(self, route: Optional[str] = None) -> int:
        return sum(1 for r in self.requests if route is None or r.route == route)

    def start(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HangUpServer:
    """Counts TCP connections and closes each one at once."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.connections = 0
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            conn.close()

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    def stop(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens."""
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()
    return port
