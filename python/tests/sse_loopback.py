"""Fake streaming providers on 127.0.0.1 (port 0) for the integration tests.

:class:`SSEServer` is a real ``ThreadingHTTPServer`` speaking three provider
dialects over ``text/event-stream``, each in the wire format the official SDKs
parse. The first path segment names the route; what follows picks the dialect:

* ``POST /{route}/chat/completions``: OpenAI chat completions
  (``data: {chat.completion.chunk}`` frames, then ``data: [DONE]``);
* ``POST /{route}/responses``: the OpenAI Responses API (``event: <type>`` and
  ``data: <json>`` frames with strictly increasing ``sequence_number`` from 0,
  ending with ``response.completed``); ``GET /{route}/responses/{id}?stream=true
  &starting_after=N`` replays that response's events with a sequence number
  above ``N``, as OpenAI resumes a background response;
* ``POST /{route}/v1/messages``: Anthropic messages (``message_start`` ...
  ``message_stop``).

So an SDK client points at ``f"{server.base()}/{route}"`` (``server.url(route)``)
for both OpenAI and Anthropic.

Each route answers its script in order; the last reply repeats. A reply is a
dict (every key optional)::

    {"text": "Hello world from the primary", "chunks": 5}

``text`` is split into ``chunks`` content deltas (the "content-bearing events";
``N`` below counts them: a fault with ``N = 0`` fires before the first delta,
one with ``N`` at or above the number of deltas fires after the last one).
Faults:

* ``cut_after: N``: N deltas, then the socket is closed without ending the
  chunked body (``cut_reset: True`` sends a TCP reset instead of a FIN);
* ``stall_after: N, stall_s: float``: N deltas, a pause, then the rest;
* ``error_after: N``: N deltas, then the dialect's error event, then a clean end;
* ``end_after: N``: N deltas, then a clean end of the body (nothing more);
* ``no_terminal: True``: everything but the terminal event (``[DONE]``,
  ``response.completed``, ``message_stop``), then a clean end;
* ``malformed_after: N``: N deltas, then a frame whose data is not JSON, then the rest;
* ``oversize_after: N, oversize_bytes: K``: one more delta of K bytes after the
  N-th (it is part of the text, so the final events carry it too);
* ``sequence_back_after: N`` (Responses only): the event after the N-th delta
  carries a sequence number one below its predecessor's;
* ``status: 429`` (or 500, 503, 529, ...), with optional ``headers``: a plain
  JSON error in the dialect's shape instead of a stream.

``tool_call: {"name": ..., "arguments": {...}}`` (chat and Anthropic, not
streamed): the final object calls that tool instead of answering in text.

Other keys: ``headers`` (added to any reply), ``model``, ``id`` (the response or
message id; by default ``resp_{route}_{n}``, ``msg_{route}_{n}``,
``chatcmpl-{route}_{n}`` for the route's n-th request), ``input_tokens``,
``ping`` (Anthropic: a ``ping`` event after ``message_start``, default True),
``error_code`` and ``error_message`` (for ``error_after`` and ``status``).

A Responses resume (the GET) takes the route's next reply too, but only its
faults and ``status``: the events replayed are those of the stored response.
A request without ``"stream": true`` gets the final object as plain JSON.

Every request is logged (:class:`SSERequest`) with its route, method, path,
query, ``Idempotency-Key``, arrival time and parsed JSON body.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qsl, urlsplit

Reply = Dict[str, Any]

DEFAULT_TEXT = "Hello world from the primary"
CREATED = 1_700_000_000


class SSERequest:
    def __init__(
        self,
        route: str,
        method: str,
        path: str,
        query: Dict[str, str],
        idempotency_key: Optional[str],
        arrived: float,
        body: Any,
    ) -> None:
        self.route = route
        self.method = method
        self.path = path
        self.query = query
        self.idempotency_key = idempotency_key
        self.arrived = arrived
        self.body = body

    def __repr__(self) -> str:
        return f"SSERequest({self.method} {self.path} key={self.idempotency_key!r})"


class Event:
    """One SSE frame to write: ``name`` (None for a data-only frame) and ``data``."""

    def __init__(self, name: Optional[str], data: Any, delta: bool = False) -> None:
        self.name = name
        self.data = data
        self.delta = delta  # a content-bearing event, counted by the faults

    def frame(self, seq: Optional[int] = None) -> bytes:
        data = self.data
        if seq is not None and isinstance(data, dict):
            data = {**data, "sequence_number": seq}
        text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        head = f"event: {self.name}\n" if self.name is not None else ""
        return f"{head}data: {text}\n\n".encode()


def split_text(text: str, chunks: int) -> List[str]:
    """``text`` in ``chunks`` nonempty pieces (fewer if it is shorter), split at spaces when it can."""
    if not text:
        return []
    chunks = max(1, min(chunks, len(text)))
    words = text.split(" ")
    if len(words) >= chunks:
        # Whole words, spread evenly; the separating spaces open the later pieces.
        per, extra = divmod(len(words), chunks)
        pieces, start = [], 0
        for i in range(chunks):
            end = start + per + (1 if i < extra else 0)
            pieces.append((" " if i else "") + " ".join(words[start:end]))
            start = end
        return pieces
    per, extra = divmod(len(text), chunks)
    pieces, start = [], 0
    for i in range(chunks):
        end = start + per + (1 if i < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def pieces_of(reply: Reply) -> List[str]:
    pieces = split_text(str(reply.get("text", DEFAULT_TEXT)), int(reply.get("chunks", 5)))
    if "oversize_after" in reply:
        at = min(int(reply["oversize_after"]), len(pieces))
        pieces.insert(at, "x" * int(reply.get("oversize_bytes", 1 << 20)))
    return pieces


def error_body(dialect: str, status: int, reply: Reply) -> Dict[str, Any]:
    """The JSON error document a provider sends with ``status``."""
    message = str(reply.get("error_message") or f"fake {status}")
    if dialect == "anthropic":
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error")
        return {"type": "error", "error": {"type": str(reply.get("error_code") or kind), "message": message}}
    kind = {429: "rate_limit_exceeded", 400: "invalid_request_error", 404: "not_found"}.get(status, "server_error")
    code = reply.get("error_code") or kind
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Script:
    """The events of one scripted reply and its final (non-streamed) object."""

    def __init__(self, dialect: str, events: List[Event], final: Dict[str, Any], terminal: bool = True) -> None:
        self.dialect = dialect
        self.events = events
        self.final = final
        self.terminal = terminal  # the last event is the terminal one


def chat_script(reply: Reply, ident: str, request: Dict[str, Any]) -> Script:
    model = str(reply.get("model") or request.get("model") or "gpt-fake")
    pieces = pieces_of(reply)
    text = "".join(pieces)
    usage_wanted = bool((request.get("stream_options") or {}).get("include_usage"))
    prompt = int(reply.get("input_tokens", 12))
    usage = {"prompt_tokens": prompt, "completion_tokens": len(pieces), "total_tokens": prompt + len(pieces)}

    def chunk(delta: Dict[str, Any], finish: Optional[str] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage_wanted:
            body["usage"] = None
        return body

    events = [Event(None, chunk({"role": "assistant", "content": "", "refusal": None}))]
    events += [Event(None, chunk({"content": p}), delta=True) for p in pieces]
    events.append(Event(None, chunk({}, "stop")))
    if usage_wanted:
        events.append(
            Event(
                None,
                {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": CREATED,
                    "model": model,
                    "system_fingerprint": "fp_fake",
                    "choices": [],
                    "usage": usage,
                },
            )
        )
    events.append(Event(None, "[DONE]"))
    message: Dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    finish = "stop"
    if reply.get("tool_call"):
        call = reply["tool_call"]
        message = {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "tool_calls": [
                {
                    "id": f"call_{ident}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
                }
            ],
        }
        finish = "tool_calls"
    final = {
        "id": ident,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": usage,
    }
    return Script("chat", events, final)


def responses_script(reply: Reply, ident: str, request: Dict[str, Any]) -> Script:
    model = str(reply.get("model") or request.get("model") or "gpt-fake")
    pieces = pieces_of(reply)
    text = "".join(pieces)
    item_id = "msg_" + ident.removeprefix("resp_")
    prompt = int(reply.get("input_tokens", 12))
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": len(pieces),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + len(pieces),
    }

    def response(status: str, output: List[Any], with_usage: bool) -> Dict[str, Any]:
        return {
            "id": ident,
            "object": "response",
            "created_at": CREATED,
            "status": status,
            "background": bool(request.get("background", False)),
            "error": None,
            "incomplete_details": None,
            "instructions": request.get("instructions"),
            "max_output_tokens": None,
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": True,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage if with_usage else None,
            "user": None,
            "metadata": {},
        }

    def part(t: str) -> Dict[str, Any]:
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": t}

    def item(status: str, content: List[Any]) -> Dict[str, Any]:
        return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    at = {"item_id": item_id, "output_index": 0, "content_index": 0}
    raw: List[Tuple[str, Dict[str, Any], bool]] = [
        ("response.created", {"response": response("in_progress", [], False)}, False),
        ("response.in_progress", {"response": response("in_progress", [], False)}, False),
        ("response.output_item.added", {"output_index": 0, "item": item("in_progress", [])}, False),
        ("response.content_part.added", {**at, "part": part("")}, False),
    ]
    raw += [("response.output_text.delta", {**at, "delta": p, "logprobs": []}, True) for p in pieces]
    done_item = item("completed", [part(text)])
    raw += [
        ("response.output_text.done", {**at, "text": text, "logprobs": []}, False),
        ("response.content_part.done", {**at, "part": part(text)}, False),
        ("response.output_item.done", {"output_index": 0, "item": done_item}, False),
        ("response.completed", {"response": response("completed", [done_item], True)}, False),
    ]
    events = [Event(name, {"type": name, **data, "sequence_number": seq}, d) for seq, (name, data, d) in enumerate(raw)]
    return Script("responses", events, response("completed", [done_item], True))


def anthropic_script(reply: Reply, ident: str, request: Dict[str, Any]) -> Script:
    model = str(reply.get("model") or request.get("model") or "claude-fake")
    pieces = pieces_of(reply)
    text = "".join(pieces)
    prompt = int(reply.get("input_tokens", 12))
    start_usage = {
        "input_tokens": prompt,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    message: Dict[str, Any] = {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    events = [Event("message_start", {"type": "message_start", "message": message})]
    if reply.get("ping", True):
        events.append(Event("ping", {"type": "ping"}))
    events.append(
        Event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
    )
    events += [
        Event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
            delta=True,
        )
        for p in pieces
    ]
    events += [
        Event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        Event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": len(pieces)},
            },
        ),
        Event("message_stop", {"type": "message_stop"}),
    ]
    content: List[Dict[str, Any]] = [{"type": "text", "text": text}]
    stop = "end_turn"
    if reply.get("tool_call"):
        call = reply["tool_call"]
        content = [{"type": "tool_use", "id": f"toolu_{ident}", "name": call["name"], "input": call["arguments"]}]
        stop = "tool_use"
    final = {
        **message,
        "content": content,
        "stop_reason": stop,
        "usage": {**start_usage, "output_tokens": len(pieces)},
    }
    return Script("anthropic", events, final)


def error_event(dialect: str, reply: Reply, seq: int) -> Event:
    message = str(reply.get("error_message") or "fake stream error")
    if dialect == "chat":
        code = str(reply.get("error_code") or "server_error")
        return Event(None, {"error": {"message": message, "type": "server_error", "param": None, "code": code}})
    if dialect == "responses":
        code = str(reply.get("error_code") or "server_error")
        return Event("error", {"type": "error", "code": code, "message": message, "param": None, "sequence_number": seq})
    kind = str(reply.get("error_code") or "overloaded_error")
    return Event("error", {"type": "error", "error": {"type": kind, "message": reply.get("error_message") or "Overloaded"}})


def malformed_event(dialect: str) -> Event:
    name = {"chat": None, "responses": "response.output_text.delta", "anthropic": "content_block_delta"}[dialect]
    return Event(name, '{"type": "not json')


#: Faults that fire at a count of deltas, in the order they fire at the same count.
FAULTS = ("sequence_back_after", "malformed_after", "stall_after", "error_after", "end_after", "cut_after")


class SSEServer:
    """A scripted streaming server; use as ``with SSEServer({...}) as server:`` or ``start()``/``stop()``."""

    def __init__(self, scripts: Dict[str, List[Reply]]) -> None:
        self.scripts = scripts
        self.requests: List[SSERequest] = []
        self.responses: Dict[str, Script] = {}  # Responses API objects by id, for resumption
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                arrived = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                parts = urlsplit(self.path)
                route = parts.path.split("/")[1] if parts.path.count("/") >= 1 else ""
                rest = parts.path[len(route) + 1 :]
                query = dict(parse_qsl(parts.query))
                with server.lock:
                    index = sum(1 for r in server.requests if r.route == route)
                    server.requests.append(
                        SSERequest(
                            route, self.command, parts.path, query, self.headers.get("Idempotency-Key"), arrived, body
                        )
                    )
                    script = server.scripts.get(route)
                    reply: Optional[Reply] = script[min(index, len(script) - 1)] if script else None
                request = body if isinstance(body, dict) else {}
                if self.command == "POST" and rest == "/chat/completions":
                    dialect = "chat"
                elif self.command == "POST" and rest == "/responses":
                    dialect = "responses"
                elif self.command == "GET" and rest.startswith("/responses/"):
                    dialect = "resume"
                elif self.command == "POST" and rest == "/v1/messages":
                    dialect = "anthropic"
                else:
                    self._json(404, {"error": {"message": f"no such endpoint: {self.command} {parts.path}"}})
                    return
                if reply is None:
                    self._json(404, error_body("anthropic" if dialect == "anthropic" else "openai", 404, {}))
                    return
                headers = {str(k): str(v) for k, v in (reply.get("headers") or {}).items()}
                status = int(reply.get("status", 200))
                if status >= 400:
                    self._json(status, error_body(dialect, status, reply), headers)
                    return
                if dialect == "resume":
                    ident = rest[len("/responses/") :]
                    with server.lock:
                        stored = server.responses.get(ident)
                    if stored is None:
                        self._json(404, error_body("openai", 404, {"error_message": f"No response with id '{ident}'"}))
                        return
                    if query.get("stream") != "true":
                        self._json(200, stored.final, headers)
                        return
                    after = int(query.get("starting_after", "-1"))
                    events = [e for e in stored.events if e.data["sequence_number"] > after]
                    self._stream(Script("responses", events, stored.final), reply, headers)
                    return
                n = index
                if dialect == "chat":
                    made = chat_script(reply, str(reply.get("id") or f"chatcmpl-{route}_{n}"), request)
                elif dialect == "responses":
                    made = responses_script(reply, str(reply.get("id") or f"resp_{route}_{n}"), request)
                    with server.lock:
                        server.responses[str(made.final["id"])] = made
                else:
                    made = anthropic_script(reply, str(reply.get("id") or f"msg_{route}_{n}"), request)
                if request.get("stream") is True:
                    self._stream(made, reply, headers)
                else:
                    self._json(200, made.final, headers)

            def _json(self, status: int, document: Any, headers: Optional[Dict[str, str]] = None) -> None:
                payload = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _end(self) -> None:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _stream(self, script: Script, reply: Reply, headers: Dict[str, str]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.flush()
                events = list(script.events)
                if reply.get("no_terminal"):
                    events = events[:-1]
                pending = [(int(reply[f]), f) for f in FAULTS if f in reply]
                deltas = sum(1 for e in events if e.delta)
                first = next((i for i, e in enumerate(events) if e.delta), len(events) - 1)
                written = 0  # deltas written
                last_seq = -1
                back = False
                try:
                    for i, event in enumerate(events + [None]):
                        if i >= first:
                            for at, fault in list(pending):
                                if written < min(at, deltas):
                                    continue
                                pending.remove((at, fault))
                                if fault == "sequence_back_after":
                                    back = True
                                elif fault == "malformed_after":
                                    self._chunk(malformed_event(script.dialect).frame())
                                elif fault == "stall_after":
                                    time.sleep(float(reply.get("stall_s", 1.0)))
                                elif fault == "error_after":
                                    self._chunk(error_event(script.dialect, reply, last_seq + 1).frame())
                                    self._end()
                                    return
                                elif fault == "end_after":
                                    self._end()
                                    return
                                elif fault == "cut_after":
                                    self._cut(bool(reply.get("cut_reset")))
                                    return
                        if event is None:
                            break
                        seq: Optional[int] = None
                        if script.dialect == "responses":
                            seq = int(event.data["sequence_number"])
                            if back:
                                seq, back = max(0, last_seq - 1), False
                            last_seq = seq
                        self._chunk(event.frame(seq))
                        written += 1 if event.delta else 0
                    self._end()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def _cut(self, reset: bool) -> None:
                self.close_connection = True
                sock = self.connection
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                sock.close()

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
        """The base URL an OpenAI or Anthropic client takes for ``route``."""
        return f"{self.base()}/{route}"

    def count(self, route: Optional[str] = None) -> int:
        with self.lock:
            return sum(1 for r in self.requests if route is None or r.route == route)

    def start(self) -> "SSEServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "SSEServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
