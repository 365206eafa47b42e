"""The receiver's guard: an HTTP endpoint protected by ``Idempotency-Key``
(docs/RECEIVER.md).

A request under a key is claimed through the core's idempotency records
(:func:`~retryledger.journal.idempotency_claim`), the record kept in a
register store (``get`` / ``compare_and_set``, any store of
:mod:`retryledger.stores`):

* the same key and request after success: the stored response, with
  ``Idempotent-Replayed: true``; the handler does not run again;
* the same key while the first request runs: ``409`` with ``Retry-After``
  (the claim's poll delay, in whole seconds, at least 1);
* the same key and another request: ``422`` (``idempotency_key_reuse``);
* no key where one is required: ``400`` (``idempotency_key_missing``);
* the store cannot be read or written: ``503`` (``store_unavailable``),
  and the handler never runs unguarded.

Every answer the guard makes itself has a JSON body ``{"code", "message"}``
with a stable ``code``. Two front ends share :class:`IdempotencyGuard`:
:meth:`IdempotencyGuard.handler`, a decorator for a handler of
:class:`HttpRequest` -> :class:`HttpResponse` (plain or ``async``), and
:class:`IdempotencyMiddleware`, a pure ASGI middleware.
"""

from __future__ import annotations

import asyncio
import inspect
import base64
import functools
import json
import math
import time
from dataclasses import dataclass, field
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
    overload,
)

from . import _core
from ._api import call, idempotency_key_sha256
from ._errors import RetryledgerError
from .journal import idempotency_claim, idempotency_complete
from .stores import Store, StoreUnavailableError

__all__ = [
    "REQUEST_SCHEMA",
    "RESPONSE_SCHEMA",
    "HttpRequest",
    "HttpResponse",
    "NoEffect",
    "Admitted",
    "IdempotencyGuard",
    "IdempotencyMiddleware",
    "check_idempotency_header",
    "http_request_sha256",
    "http_response_sha256",
]

#: The schema of the document a request's digest covers.
REQUEST_SCHEMA = "retryledger.http_request.v1"
#: The schema of a stored response (and of the document its digest covers).
RESPONSE_SCHEMA = "retryledger.http_response.v1"

#: Response headers kept with a stored response by default (lower case).
DEFAULT_KEEP_HEADERS = ("content-type", "content-language", "location", "etag", "last-modified")
#: The largest response body kept for a replay by default, bytes.
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024
#: The largest idempotency key taken, characters.
MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class HttpRequest:
    """A request as the guard sees it: ``target`` is the path and query as
    received (``/orders?dry=1``), ``headers`` lower-case names."""

    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class HttpResponse:
    """A response: status, headers (name, value) in order, body bytes."""

    status: int
    headers: Sequence[Tuple[str, str]] = ()
    body: bytes = b""

    def header(self, name: str) -> Optional[str]:
        """The first value of a header (case-insensitive), or ``None``."""
        low = name.lower()
        for k, v in self.headers:
            if k.lower() == low:
                return v
        return None

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


class NoEffect(Exception):
    """Raised by a handler that failed before it changed anything: the record
    says ``failed_no_effect`` and the same request may run again. Any other
    exception, and a response of status 500 or more, leaves the record
    ``indeterminate`` (the receiver does not know its own effect, so a retry
    under the key is refused)."""


def check_idempotency_header(raw: str) -> None:
    """Raise ``IdempotencyError`` (``idempotency_key_invalid``) unless ``raw``
    is an ``Idempotency-Key`` header value the guard takes: 1 to
    :data:`MAX_KEY_LENGTH` printable ASCII characters (the core's rule)."""
    call(_core.check_idempotency_header, raw)


def http_request_sha256(method: str, target: str, body: bytes) -> str:
    """The request digest a claim compares: SHA-256 of the canonical JSON of
    ``{"body_sha256", "method", "schema": "retryledger.http_request.v1",
    "target"}``: the method in upper case, the path and query as received,
    the SHA-256 of the body's bytes. Headers are not part of it (the core's
    ``retryledger.http_request.v1``)."""
    return _core.http_request_sha256(method, target, bytes(body))


def _kept_headers(headers: Iterable[Tuple[str, str]], keep: Sequence[str]) -> List[List[str]]:
    return [[k.lower(), v] for k, v in headers if k.lower() in keep]


def http_response_sha256(status: int, headers: Sequence[Sequence[str]], body: bytes) -> str:
    """The result digest a record holds: SHA-256 of the canonical JSON of
    ``{"body_sha256", "headers", "schema": "retryledger.http_response.v1",
    "status"}`` with the kept headers as ``[name, value]`` pairs (lower-case
    names, in order). A response too large to keep is still recorded by it.
    Raises ``DecodeError`` (``invalid_value``) for a status outside 100..999
    or a header name not in lower case."""
    return call(_core.http_response_sha256, status, json.dumps([list(h) for h in headers]), bytes(body))


def _coded(status: int, code: str, message: str, headers: Sequence[Tuple[str, str]] = ()) -> HttpResponse:
    body = json.dumps({"code": code, "message": message}, separators=(",", ":")).encode()
    return HttpResponse(status, [("content-type", "application/json"), *headers], body)


@dataclass
class Admitted:
    """A claim that won: run the handler, then :meth:`IdempotencyGuard.finish`
    or :meth:`IdempotencyGuard.fail` with this ticket."""

    key: str
    generation: int
    record: Dict[str, Any]


@dataclass
class _Decision:
    answer: Optional[HttpResponse] = None
    admitted: Optional[Admitted] = None
    unguarded: bool = False


@dataclass
class IdempotencyGuard:
    """Guards an endpoint by ``Idempotency-Key`` with records in ``store``.

    ``retention`` is the core's (``{"ttl_ms", "poll_after_ms", "expired":
    "proceed" | "reject"}``), explicit. ``tenant`` and ``operation`` scope
    the key (both or neither). ``required``: a request without the key is
    ``400``; otherwise it runs unguarded (no key, no idempotency asked).
    ``keep_headers``: the response headers kept for a replay (lower case).
    ``max_response_bytes``: a larger body is recorded by digest only, and a
    replay of it answers ``409`` ``idempotency_response_not_kept``.
    ``now_ms``: the wall clock, Unix ms. ``cas_attempts``: how many times a
    lost compare-and-set is read and claimed again before ``503``
    ``idempotency_store_contended``."""

    store: Store
    retention: Mapping[str, Any]
    tenant: Optional[str] = None
    operation: Optional[str] = None
    required: bool = True
    header: str = "idempotency-key"
    prefix: str = "idempotency/"
    keep_headers: Sequence[str] = DEFAULT_KEEP_HEADERS
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    now_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))
    cas_attempts: int = 4

    def __post_init__(self) -> None:
        if (self.tenant is None) != (self.operation is None):
            raise ValueError("tenant and operation scope a key together: give both or neither")
        self.header = self.header.lower()
        self.keep_headers = tuple(h.lower() for h in self.keep_headers)
        if self.cas_attempts < 1:
            raise ValueError("cas_attempts must be at least 1")

    # -- keys -------------------------------------------------------------

    def record_key(self, key_sha256: str) -> str:
        """The register that holds the record of a scoped key digest."""
        return f"{self.prefix}{key_sha256}"

    def response_key(self, key_sha256: str) -> str:
        """The register that holds the stored response of a scoped key digest."""
        return f"{self.prefix}{key_sha256}/response"

    def key_sha256(self, key: str) -> str:
        """The scoped digest of a raw key (the record's key)."""
        return idempotency_key_sha256(key, tenant=self.tenant, operation=self.operation)

    # -- the claim ---------------------------------------------------------

    def begin(self, request: HttpRequest) -> _Decision:
        """Claim the request's key: an answer to send at once, a ticket to run
        the handler under, or ``unguarded`` (no key, none required)."""
        raw = _header(request.headers, self.header)
        if raw is None:
            if self.required:
                return _Decision(_coded(400, "idempotency_key_missing", f"the {self.header} header is required"))
            return _Decision(unguarded=True)
        try:
            check_idempotency_header(raw)
        except RetryledgerError as refused:
            return _Decision(_coded(400, refused.code, str(refused)))
        claim_request = {
            "idempotency_key_sha256": self.key_sha256(raw),
            "request_sha256": http_request_sha256(request.method, request.target, request.body),
        }
        try:
            return self._claim(claim_request)
        except StoreUnavailableError as e:
            return _Decision(_coded(503, "store_unavailable", f"the idempotency store is unavailable: {e}"))
        except RetryledgerError as e:
            return _Decision(_coded(500, e.code, f"the stored idempotency record is refused: {e}"))

    def _claim(self, request: Dict[str, str]) -> _Decision:
        key = self.record_key(request["idempotency_key_sha256"])
        for _ in range(self.cas_attempts):
            record, generation = self.store.get(key)
            claim = idempotency_claim(self.retention, record, request, self.now_ms())
            kind = claim["kind"]
            if kind == "proceed":
                ok, _ = self.store.compare_and_set(key, generation, claim["record"])
                if ok:
                    return _Decision(admitted=Admitted(key, generation + 1, claim["record"]))
                continue  # another request won: answer as the claim on the fresh record says
            if kind == "replay":
                return _Decision(self._replay(request["idempotency_key_sha256"], claim["result_sha256"]))
            if kind == "poll":
                seconds = max(1, math.ceil(claim["retry_after_ms"] / 1000))
                return _Decision(
                    _coded(
                        409,
                        "idempotency_in_progress",
                        "a request under this key is in progress",
                        [("retry-after", str(seconds))],
                    )
                )
            reason = claim["reason"]
            if reason == "key_reuse":
                return _Decision(
                    _coded(422, "idempotency_key_reuse", "the key was used with another request")
                )
            if reason == "key_expired":
                return _Decision(
                    _coded(422, "idempotency_key_expired", "the key's record expired and the key stays spent")
                )
            return _Decision(
                _coded(
                    409,
                    "idempotency_indeterminate",
                    "the request under this key ended without knowing its effect; it is not run again",
                )
            )
        return _Decision(
            _coded(503, "idempotency_store_contended", "the record kept changing under the claim", [("retry-after", "1")])
        )

    def _replay(self, key_sha256: str, result_sha256: str) -> HttpResponse:
        stored, _ = self.store.get(self.response_key(key_sha256))
        replayed = ("idempotent-replayed", "true")
        if stored is not None and stored.get("schema") == RESPONSE_SCHEMA:
            body = base64.b64decode(stored["body_base64"])
            headers = [(str(k), str(v)) for k, v in stored["headers"]]
            if http_response_sha256(stored["status"], stored["headers"], body) == result_sha256:
                return HttpResponse(int(stored["status"]), [*headers, replayed], body)
        return _coded(
            409,
            "idempotency_response_not_kept",
            "the request under this key succeeded; its response was not kept (larger than the bound)",
            [replayed, ("idempotency-result-sha256", result_sha256)],
        )

    # -- the end of a claimed request ---------------------------------------

    def finish(self, ticket: Admitted, response: HttpResponse) -> HttpResponse:
        """Record the handler's response as the key's result and return what
        to send: the response itself, with ``Idempotency-Record-Error: <code>``
        when the record could not be written (the handler ran: its response
        is still the answer; the record stays ``in_progress`` until it
        expires). A status of 500 or more is recorded ``indeterminate`` (not
        replayed): the guard cannot tell what a server error did."""
        if response.status >= 500:
            code = self.fail(ticket, False)
            return response if code is None else _with_header(response, ("idempotency-record-error", code))
        kept = _kept_headers(response.headers, self.keep_headers)
        result = http_response_sha256(response.status, kept, response.body)
        try:
            if len(response.body) <= self.max_response_bytes:
                self._write_response(ticket, response, kept, result)
            self._complete(ticket, "succeeded", result)
        except StoreUnavailableError:
            return _with_header(response, ("idempotency-record-error", "store_unavailable"))
        except _Lost:
            return _with_header(response, ("idempotency-record-error", "idempotency_record_lost"))
        return response

    def fail(self, ticket: Admitted, no_effect: bool) -> Optional[str]:
        """Record a handler that raised: ``failed_no_effect`` when it says
        nothing happened, else ``indeterminate``. Returns an error code when
        the record could not be written, else ``None``."""
        try:
            self._complete(ticket, "failed_no_effect" if no_effect else "indeterminate", None)
        except StoreUnavailableError:
            return "store_unavailable"
        except _Lost:
            return "idempotency_record_lost"
        return None

    def _write_response(self, ticket: Admitted, response: HttpResponse, kept: List[List[str]], result: str) -> None:
        document = {
            "body_base64": base64.b64encode(response.body).decode("ascii"),
            "headers": kept,
            "result_sha256": result,
            "schema": RESPONSE_SCHEMA,
            "status": response.status,
        }
        key = self.response_key(ticket.record["idempotency_key_sha256"])
        for _ in range(self.cas_attempts):
            _, generation = self.store.get(key)
            ok, _ = self.store.compare_and_set(key, generation, document)
            if ok:
                return
        raise _Lost()

    def _complete(self, ticket: Admitted, status: str, result: Optional[str]) -> None:
        completion: Dict[str, Any] = {
            "idempotency_key_sha256": ticket.record["idempotency_key_sha256"],
            "request_sha256": ticket.record["request_sha256"],
            "status": status,
        }
        if result is not None:
            completion["result_sha256"] = result
        final = idempotency_complete(self.retention, ticket.record, completion, self.now_ms())
        ok, _ = self.store.compare_and_set(ticket.key, ticket.generation, final)
        if not ok:
            raise _Lost()  # the record changed under the claim (it expired and was claimed again)

    # -- front ends ------------------------------------------------------------

    @overload
    def handler(self, fn: Callable[[HttpRequest], Awaitable[HttpResponse]]) -> Callable[[HttpRequest], Awaitable[HttpResponse]]: ...

    @overload
    def handler(self, fn: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]: ...

    def handler(
        self, fn: Union[Callable[[HttpRequest], HttpResponse], Callable[[HttpRequest], Awaitable[HttpResponse]]]
    ) -> Union[Callable[[HttpRequest], HttpResponse], Callable[[HttpRequest], Awaitable[HttpResponse]]]:
        """Decorate a handler of :class:`HttpRequest`: plain or ``async`` (the
        store is then called on a worker thread)."""
        if inspect.iscoroutinefunction(fn):
            afn = cast(Callable[[HttpRequest], Awaitable[HttpResponse]], fn)

            @functools.wraps(afn)
            async def guarded_async(request: HttpRequest) -> HttpResponse:
                decision = await asyncio.to_thread(self.begin, request)
                if decision.answer is not None:
                    return decision.answer
                if decision.admitted is None:
                    return await afn(request)
                ticket = decision.admitted
                try:
                    response = await afn(request)
                except BaseException as e:
                    await asyncio.to_thread(self.fail, ticket, isinstance(e, NoEffect))
                    raise
                return await asyncio.to_thread(self.finish, ticket, response)

            return guarded_async

        sfn = cast(Callable[[HttpRequest], HttpResponse], fn)

        @functools.wraps(sfn)
        def guarded(request: HttpRequest) -> HttpResponse:
            decision = self.begin(request)
            if decision.answer is not None:
                return decision.answer
            if decision.admitted is None:
                return sfn(request)
            ticket = decision.admitted
            try:
                response = sfn(request)
            except BaseException as e:
                self.fail(ticket, isinstance(e, NoEffect))
                raise
            return self.finish(ticket, response)

        return guarded


class _Lost(Exception):
    """A write of the guard lost its compare-and-set for good."""


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    value = headers.get(name)
    if value is not None:
        return value
    for k, v in headers.items():
        if k.lower() == name:
            return v
    return None


def _with_header(response: HttpResponse, header: Tuple[str, str]) -> HttpResponse:
    return HttpResponse(response.status, [*response.headers, header], response.body)


# -- ASGI ------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class IdempotencyMiddleware:
    """A pure ASGI middleware guarding ``app`` (HTTP requests whose method is
    in ``methods``; others pass through). It reads the whole request body
    before the claim (the digest covers it) and buffers the app's response to
    record it; an app that raises before it started its response records
    ``indeterminate`` (``failed_no_effect`` for :class:`NoEffect`) and the
    exception propagates to the server."""

    def __init__(
        self,
        app: ASGIApp,
        guard: IdempotencyGuard,
        methods: Iterable[str] = ("POST", "PUT", "PATCH", "DELETE"),
    ) -> None:
        self.app = app
        self.guard = guard
        self.methods = frozenset(m.upper() for m in methods)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            await self.app(scope, receive, send)
            return
        chunks: List[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        raw_path = scope.get("raw_path")
        path = raw_path.decode("latin-1") if raw_path else scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        target = f"{path}?{query}" if query else path
        headers: Dict[str, str] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        request = HttpRequest(scope["method"], target, headers, body)

        decision = await asyncio.to_thread(self.guard.begin, request)
        if decision.answer is not None:
            await _send_response(send, decision.answer)
            return

        replayed = False

        async def replay_receive() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        if decision.admitted is None:
            await self.app(scope, replay_receive, send)
            return
        ticket = decision.admitted
        status = 500
        out_headers: List[Tuple[str, str]] = []
        out_body: List[bytes] = []
        done = False

        async def capture(message: Message) -> None:
            nonlocal status, done
            if message["type"] == "http.response.start":
                status = int(message["status"])
                out_headers.extend((k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", []))
            elif message["type"] == "http.response.body":
                out_body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done = True

        try:
            await self.app(scope, replay_receive, capture)
        except BaseException as e:
            await asyncio.to_thread(self.guard.fail, ticket, isinstance(e, NoEffect))
            raise
        if not done:
            # The app returned without a complete response: nothing to record as its result.
            await asyncio.to_thread(self.guard.fail, ticket, False)
            await _send_response(send, _coded(500, "idempotency_no_response", "the handler sent no complete response"))
            return
        response = HttpResponse(status, out_headers, b"".join(out_body))
        await _send_response(send, await asyncio.to_thread(self.guard.finish, ticket, response))


async def _send_response(send: Send, response: HttpResponse) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
    if not any(k.lower() == b"content-length" for k, _ in headers):
        headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})
