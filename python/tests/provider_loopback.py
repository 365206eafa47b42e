"""One loopback server on 127.0.0.1 speaking three providers' wire formats.

The first path segment names the provider; the rest is that provider's own
path, as its SDK sends it:

* ``/openai/chat/completions`` and ``/openai/responses`` (OpenAI);
* ``/anthropic/v1/messages`` (Anthropic Messages);
* ``/google/v1beta/models/<model>:generateContent`` and
  ``...:streamGenerateContent?alt=sse`` (Gemini).

Each provider answers its script in order (repeating the last reply). A
reply is ``{"status", "body", "headers"?}`` (a JSON answer) or ``{"sse":
[event, ...], "cut_after"?: n}`` (an event stream in the provider's framing;
``cut_after`` closes the connection after n events, mid-body). Every request
is recorded with its provider, path, ``Idempotency-Key`` and parsed JSON
body, so a test can compare the body each server received with the body the
lowering promised.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional


class Received:
    """One request as the server received it."""

    def __init__(self, provider: str, path: str, idempotency_key: Optional[str], body: Any) -> None:
        self.provider = provider
        self.path = path
        self.idempotency_key = idempotency_key
        #: The JSON body, parsed.
        self.body = body

    def __repr__(self) -> str:
        return f"Received({self.provider!r}, {self.path!r})"


def _frame(provider: str, event: Any) -> bytes:
    """One event in the provider's SSE framing."""
    if provider == "anthropic":
        return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
    if provider == "google":
        return f"data: {json.dumps(event)}\r\n\r\n".encode()
    if event == "[DONE]":
        return b"data: [DONE]\n\n"
    return f"data: {json.dumps(event)}\n\n".encode()


class ProviderServer:
    """The three providers on one port."""

    def __init__(self, scripts: Dict[str, List[Dict[str, Any]]]) -> None:
        self.scripts = scripts
        self.received: List[Received] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                provider = self.path.split("/")[1]
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with server.lock:
                    index = sum(1 for r in server.received if r.provider == provider)
                    server.received.append(
                        Received(provider, self.path, self.headers.get("Idempotency-Key"), body)
                    )
                    script = server.scripts[provider]
                    reply = script[min(index, len(script) - 1)]
                if "sse" in reply:
                    self._stream(provider, reply)
                else:
                    self._json(int(reply["status"]), reply["body"], reply.get("headers") or {})

            def _json(self, status: int, document: Any, headers: Dict[str, str]) -> None:
                payload = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _stream(self, provider: str, reply: Dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                cut: Optional[int] = reply.get("cut_after")
                try:
                    for i, event in enumerate(reply["sse"]):
                        if cut is not None and i >= cut:
                            self._cut()
                            return
                        self._chunk(_frame(provider, event))
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def _cut(self) -> None:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.connection.close()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, provider: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{provider}"

    def bodies(self, provider: str) -> List[Any]:
        with self.lock:
            return [r.body for r in self.received if r.provider == provider]

    def start(self) -> "ProviderServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    def __enter__(self) -> "ProviderServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
