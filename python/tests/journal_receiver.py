"""A fake receiver for the journal crash tests: a loopback HTTP server that
records every attempt it receives by idempotency key and ordinal, answers it by
the run's script, and answers reconciliation questions by what it recorded.

    POST /attempt   headers Idempotency-Key, X-Run, X-Ordinal, X-Route, X-Route-Ordinal
                    -> the script's status for (route, route ordinal): 200, 429 or 503
    GET  /status?run=..&ordinal=..   header Idempotency-Key
                    -> {"answer": ...}: the first question about an attempt it
                       served with 200 is ``in_progress`` (so recovery polls), then
                       ``succeeded``; one it refused or never received is
                       ``failed_no_effect`` (it had no effect)
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Tuple
from urllib.parse import parse_qs, urlparse

#: What the receiver answers, by (route id, route ordinal).
SCRIPTS: Dict[str, Dict[Tuple[str, int], int]] = {
    # The reference run: the primary is rate limited, then unavailable; the fallback serves.
    "reference": {("private-primary", 1): 429, ("private-primary", 2): 503, ("external-fallback", 1): 200,
                  ("external-fallback", 2): 200},
    # A fallback run: the primary fails twice, the fallback once, then serves.
    "fallback": {("private-primary", 1): 503, ("private-primary", 2): 503, ("external-fallback", 1): 503,
                 ("external-fallback", 2): 200},
}


class Receiver:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: run -> script name
        self.scripts: Dict[str, str] = {}
        #: (run, key, ordinal) -> statuses served, in order
        self.served: Dict[Tuple[str, str, int], List[int]] = {}
        #: (run, key, ordinal) -> reconciliation questions asked
        self.asked: Counter[Tuple[str, str, int]] = Counter()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, status: int, body: Dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(n)
                run = self.headers["X-Run"]
                key = self.headers["Idempotency-Key"]
                ordinal = int(self.headers["X-Ordinal"])
                route = (self.headers["X-Route"], int(self.headers["X-Route-Ordinal"]))
                with receiver.lock:
                    status = SCRIPTS[receiver.scripts[run]][route]
                    receiver.served.setdefault((run, key, ordinal), []).append(status)
                self.reply(status, {"ordinal": ordinal, "route": route[0]})

            def do_GET(self) -> None:
                q = parse_qs(urlparse(self.path).query)
                run, ordinal = q["run"][0], int(q["ordinal"][0])
                key = self.headers["Idempotency-Key"]
                with receiver.lock:
                    k = (run, key, ordinal)
                    receiver.asked[k] += 1
                    served = receiver.served.get(k, [])
                    if served and served[-1] == 200:
                        answer = "in_progress" if receiver.asked[k] == 1 else "succeeded"
                    else:
                        answer = "failed_no_effect"
                self.reply(200, {"answer": answer})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self, run: str) -> Dict[int, List[int]]:
        """ordinal -> statuses served, for one run."""
        with self.lock:
            return {o: list(s) for (r, _, o), s in self.served.items() if r == run}
