"""The READMEs' first example runs verbatim against a loopback server: a 429
with Retry-After then a 503 on the primary, a completion on the fallback; the
run waits out the hint, falls back and prints a verified receipt."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, List

import pytest

from test_openai import FakeProvider

ROOT = Path(__file__).resolve().parents[2]


def block(path: str) -> str:
    text = (ROOT / path).read_text()
    m = re.search(r"```python\n(import os\nimport openai, retryledger, retryledger.openai\n.*?)```", text, re.S)
    assert m, f"{path} starts with the first example"
    return m.group(1)


def test_both_readmes_show_the_same_first_example() -> None:
    assert block("README.md") == block("python/README.md")
    first_python = (ROOT / "python/README.md").read_text().index("```python")
    assert (ROOT / "python/README.md").read_text()[first_python:].startswith("```python\n" + block("README.md"))


def test_the_first_example_runs_against_a_loopback_server(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = FakeProvider({"primary": [(429, {"retry-after": "1"}), (503, {})], "fallback": [(200, {})]})
    provider.thread.start()
    monkeypatch.setenv("LLM_BASE_URL", provider.url("primary").removesuffix("/primary/v1"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    printed: List[Any] = []
    scope = {"print": lambda *a: printed.append(a)}
    try:
        exec(compile(block("README.md"), "README.md", "exec"), scope)
    finally:
        provider.server.shutdown()
        provider.server.server_close()
    assert [r.route for r in provider.requests] == ["primary", "primary", "fallback"]
    assert {r.idempotency_key for r in provider.requests} == {"incident-42"}
    # the Retry-After hint (1 s) was waited out before the second attempt
    assert provider.requests[1].arrived - provider.replied[0] >= 0.99
    content, terminal, fallback_used = printed[0]
    assert isinstance(content, str) and terminal == "completed" and fallback_used is True
    assert printed[1] == ("verified",)
