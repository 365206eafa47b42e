"""python/README.md's LangChain and Pydantic AI examples run as written: the
SDKs find the loopback providers through their environment variables, the
spec is the frameworks' tests' (an openai route, then an anthropic route)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import retryledger

from framework_support import routes_of, spec
from sse_loopback import SSEServer

ROOT = Path(__file__).resolve().parents[2]


def block(first_line: str) -> str:
    text = (ROOT / "python/README.md").read_text()
    m = re.search(r"```python\n(" + re.escape(first_line) + r"\n.*?)```", text, re.S)
    assert m, f"python/README.md shows the example that starts with {first_line!r}"
    return m.group(1)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[SSEServer]:
    with SSEServer({"oa": [{"status": 503}], "an": [{"text": "from the fallback"}]}) as s:
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        monkeypatch.setenv("OPENAI_BASE_URL", s.url("oa"))
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", s.url("an"))
        monkeypatch.delenv("ANTHROPIC_API_URL", raising=False)
        yield s


def run_example(first_line: str) -> Tuple[List[Any], Dict[str, Any]]:
    printed: List[Any] = []
    scope: Dict[str, Any] = {"spec": spec(), "print": lambda *a: printed.append(a)}
    exec(compile(block(first_line), "python/README.md", "exec"), scope)
    return printed, scope


def receipt_of(scope: Dict[str, Any]) -> Dict[str, Any]:
    if "answer" in scope:  # LangChain
        meta: Dict[str, Any] = scope["answer"].response_metadata["retryledger"]
    else:
        meta = scope["result"].response.provider_details["retryledger"]
    return meta


@pytest.mark.parametrize(
    "first_line",
    ["from langchain_anthropic import ChatAnthropic", "from anthropic import AsyncAnthropic"],
)
def test_the_example_runs_and_prints_the_receipt_digest(server: SSEServer, first_line: str) -> None:
    printed, scope = run_example(first_line)
    meta = receipt_of(scope)
    assert printed[0][0] == meta["receipt_sha256"] == retryledger.digest(meta["receipt"])
    assert meta["receipt"]["attempt_count"] == server.count()
    # The primary's two attempts (its bound), then the fallback: three requests, one run.
    assert routes_of(server) == ["oa", "oa", "an"]
    with server.lock:
        assert len({r.idempotency_key for r in server.requests}) == 1


@pytest.mark.parametrize(
    "first_line",
    ["from langchain_anthropic import ChatAnthropic", "from anthropic import AsyncAnthropic"],
)
def test_the_root_readme_shows_the_same_example(first_line: str) -> None:
    assert "```python\n" + block(first_line) + "```" in (ROOT / "README.md").read_text()
