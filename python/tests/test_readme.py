"""README.md and python/README.md show the same Python example, and it runs
against a fake client whose first call fails the way an SDK does (an
exception class with a status code and Retry-After)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any


ROOT = Path(__file__).resolve().parents[2]


def block(path: str) -> str:
    text = (ROOT / path).read_text()
    m = re.search(r"```python\n(import retryledger\n.*?)```", text, re.S)
    assert m, f"{path} shows the example"
    return m.group(1)


def test_both_readmes_show_the_same_example() -> None:
    assert block("README.md") == block("python/README.md")


def test_the_example_runs() -> None:
    key = "readme-key"
    case = json.loads((ROOT / "tests/vectors/drivers.json").read_text())["cases"][0]
    policy = json.loads(case["input"]["policy"])
    policy["idempotency_key_sha256"] = hashlib.sha256(key.encode()).hexdigest()

    class RateLimitError(Exception):
        status_code = 429
        response = SimpleNamespace(headers={"retry-after-ms": "5"})

    calls: list[str] = []

    def call_model(route_id: str, *, idempotency_key: str, timeout_ms: int) -> Any:
        assert idempotency_key == key and timeout_ms > 0
        calls.append(route_id)
        if len(calls) == 1:
            raise RateLimitError()
        return SimpleNamespace(cost_micro_usd=7, text=f"hello from {route_id}")

    printed: list[tuple[Any, ...]] = []
    scope = {
        "policy_json": json.dumps(policy),
        "idempotency_key": key,
        "call_model": call_model,
        "print": lambda *a: printed.append(a),
    }
    exec(compile(block("README.md"), "README.md", "exec"), scope)
    assert len(calls) == 2
    value, terminal, attempts_sha256 = printed[0]
    assert (value, terminal) == ("hello from private-primary", "completed")
    assert re.fullmatch(r"[0-9a-f]{64}", attempts_sha256)
