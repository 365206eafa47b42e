"""README's openai example runs as written: a policy built from the SDK call
and the builder vectors' spec, real openai clients, a loopback server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, List

import retryledger
from test_openai import FakeProvider

ROOT = Path(__file__).resolve().parents[2]


def block() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```python\n(import openai, retryledger, retryledger.openai\n.*?)```", text, re.S)
    assert m, "README shows the openai example"
    return m.group(1)


def test_the_openai_example_runs_against_a_loopback_server() -> None:
    builder = json.loads((ROOT / "tests/vectors/builder.json").read_text())["cases"]
    spec = json.loads(next(c for c in builder if c["name"] == "build_reference_spec")["input"]["spec"])
    provider = FakeProvider({"private-primary": [(503, {"retry-after-ms": "5"})], "external-fallback": [(200, {})]})
    provider.thread.start()
    try:
        printed: List[Any] = []
        urls = {r["route_id"]: provider.url(r["route_id"]) for r in spec["routes"]}
        scope = {"spec": spec, "urls": urls, "print": lambda *a: printed.append(a)}
        exec(compile(block(), "README.md", "exec"), scope)
    finally:
        provider.server.shutdown()
        provider.server.server_close()
    assert re.fullmatch(r"[0-9a-f]{64}", printed[0][0])
    # two attempts on the primary (its bound), then the fallback; one key throughout
    assert [r.route for r in provider.requests] == ["private-primary", "private-primary", "external-fallback"]
    assert {r.idempotency_key for r in provider.requests} == {"incident-42"}
    result = scope["result"]
    assert result.receipt["fallback_used"] is True
    request = retryledger.lift_request("openai.chat.completions", scope["params"])
    assert result.bundle["policy"]["logical_request_sha256"] == retryledger.request_sha256(request)
