"""Shared by the fleet and store tests: the stores under test (memory, SQLite,
Redis, PostgreSQL), the servers of tests/servers/with-redis.sh and
with-postgres.sh, and a policy with a fleet section."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from typing import Protocol

from retryledger.stores import Log, MemoryStore, PostgresStore, RedisStore, SQLiteStore, Store

from conftest import make_policy

HERE = Path(__file__).resolve().parent
CHILD = HERE / "fleet_child.py"

BREAKER = {"consecutive_failures": 2, "half_open_probes": 1, "open_ms": 10_000}


def redis_url() -> str:
    """The Redis server's URL (``REDIS_URL``). Under make (``MAKELEVEL`` set) a
    missing server is a failure; run by hand, the test is skipped with the reason."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    reason = "REDIS_URL is not set: run under tests/servers/with-redis.sh (it starts a Redis of its own)"
    if os.environ.get("MAKELEVEL"):
        pytest.fail(reason)
    pytest.skip(reason)
    raise AssertionError("unreachable")


def database_url() -> str:
    """The PostgreSQL server's URL (``DATABASE_URL``). Under make (``MAKELEVEL``
    set) a missing server is a failure; run by hand, the test is skipped with the reason."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    reason = "DATABASE_URL is not set: run under tests/servers/with-postgres.sh (it starts a PostgreSQL of its own)"
    if os.environ.get("MAKELEVEL"):
        pytest.fail(reason)
    pytest.skip(reason)
    raise AssertionError("unreachable")


class StoreAndLog(Store, Log, Protocol):
    """What every store here is: registers and append logs."""


def make_store(backend: str, tmp: Path) -> StoreAndLog:
    """A store of a backend: a fresh one (memory), a file under ``tmp`` (SQLite),
    or the test server (Redis, PostgreSQL; each test uses a fresh namespace).
    Every one is a register store and an append log."""
    if backend == "memory":
        return MemoryStore()
    if backend == "sqlite":
        return SQLiteStore(tmp / "fleet.sqlite3")
    if backend == "redis":
        return RedisStore(url=redis_url())
    if backend == "postgres":
        return PostgresStore(database_url())
    raise ValueError(backend)


def store_target(backend: str, tmp: Path) -> str:
    """How a child process opens the same store: the SQLite file, the Redis or the PostgreSQL URL."""
    if backend == "sqlite":
        return str(tmp / "fleet.sqlite3")
    if backend == "redis":
        return redis_url()
    if backend == "postgres":
        return database_url()
    raise ValueError(backend)


def namespace() -> str:
    """A namespace no other test uses."""
    return f"test-{uuid.uuid4().hex}"


def fleet_policy(
    breaker: Optional[Dict[str, Any]] = None,
    budget: Optional[Dict[str, Any]] = None,
    on_store_unavailable: str = "fail_closed",
    **overrides: Any,
) -> Dict[str, Any]:
    """The reference policy (two routes, two attempts each) with a fleet section."""
    fleet: Dict[str, Any] = {"on_store_unavailable": on_store_unavailable}
    if breaker is not None:
        fleet["breaker"] = breaker
    if budget is not None:
        fleet["retry_budget"] = budget
    return make_policy(fleet=fleet, **overrides)


def free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


class RedisServer:
    """A Redis server of a test's own (Debian's redis-server, no persistence),
    to kill and restart on the same port mid-run. Needs ``redis-server``:
    under make a missing binary fails the test, run by hand it skips."""

    def __init__(self, directory: Path) -> None:
        import shutil

        if shutil.which("redis-server") is None:
            reason = "redis-server is not installed"
            if os.environ.get("MAKELEVEL"):
                pytest.fail(reason)
            pytest.skip(reason)
        self.port = free_port()
        self.dir = directory
        self.process: Optional["subprocess.Popen[bytes]"] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import subprocess
        import time

        self.process = subprocess.Popen(
            [
                "redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir),
                "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
                "--logfile", str(self.dir / "redis.log"),
            ]
        )
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.RedisError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(self.dir / 'redis.log').read_text()}")
            time.sleep(0.02)
        client.close()

    def kill(self) -> None:
        """SIGKILL the server and wait for it."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def __enter__(self) -> "RedisServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


class Server:
    """A loopback HTTP server for fleet tests: every request is held
    ``hold_s`` and answered 200. Logs each request's arrival (Unix ms), its
    ``X-Run`` and ``X-Tenant`` headers, and counts the most requests held at
    once."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.log: List[Tuple[float, str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                arrived = time.time() * 1000
                with server.lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.log.append((arrived, self.headers.get("X-Run", ""), self.headers.get("X-Tenant", "")))
                time.sleep(server.hold_s)
                with server.lock:
                    server.in_flight -= 1
                body = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/model"

    def __enter__(self) -> "Server":
        self.thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.http.shutdown()
        self.http.server_close()
        if self.thread is not None:
            self.thread.join(timeout=10)
