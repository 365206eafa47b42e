"""``@retryledger.retry``: the drivers as a decorator, sync and async."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

import retryledger

ROOT = Path(__file__).resolve().parents[2]


def policy_for(key: str) -> Dict[str, Any]:
    case = json.loads((ROOT / "tests/vectors/drivers.json").read_text())["cases"][0]
    p: Dict[str, Any] = json.loads(case["input"]["policy"])
    p["idempotency_key_sha256"] = hashlib.sha256(key.encode()).hexdigest()
    return p


class Unavailable(Exception):
    status_code = 503


def fake_time() -> Dict[str, Any]:
    now = [0.0]

    def sleep(ms: float) -> None:
        now[0] += ms

    async def asleep(ms: float) -> None:
        now[0] += ms

    return {"clock": lambda: now[0], "sleep": sleep, "asleep": asleep}


def test_a_decorated_function_retries_and_keeps_its_receipt() -> None:
    t = fake_time()
    calls: List[str] = []

    @retryledger.retry(policy_for("k-1"), idempotency_key="k-1", clock=t["clock"], sleep=t["sleep"])
    def summarize(step: retryledger.Step, text: str) -> str:
        calls.append(step.route_id)
        if len(calls) == 1:
            raise Unavailable()
        return text.upper()

    assert summarize("hi") == "HI"
    assert calls == ["private-primary", "private-primary"]
    calls.clear()
    result = summarize.run("again")
    assert result.value == "AGAIN" and result.terminal == "completed"
    assert len(result.receipt["attempts_sha256"]) == 64
    assert summarize.__name__ == "summarize"


def test_policy_and_key_from_the_arguments() -> None:
    t = fake_time()

    @retryledger.retry(lambda order: policy_for(order), idempotency_key=lambda order: order, clock=t["clock"], sleep=t["sleep"])
    def fetch(step: retryledger.Step, order: str) -> str:
        assert step.idempotency_key == order
        return order

    assert fetch("o-1") == "o-1"
    assert fetch("o-2") == "o-2"


def test_a_stopped_run_raises_with_the_bundle() -> None:
    t = fake_time()

    @retryledger.retry(policy_for("k-2"), idempotency_key="k-2", clock=t["clock"], sleep=t["sleep"])
    def broken(step: retryledger.Step) -> str:
        raise KeyError("unknown")

    with pytest.raises(retryledger.UnrecognizedDispatchError) as e:
        broken()
    assert e.value.code == "stop_indeterminate"
    assert e.value.bundle["receipt"]["attempt_count"] == 1


def test_async_functions_use_the_asyncio_driver() -> None:
    t = fake_time()
    seen: List[int] = []

    @retryledger.retry(policy_for("k-3"), idempotency_key="k-3", clock=t["clock"], sleep=t["asleep"])
    async def answer(step: retryledger.Step, n: int) -> int:
        seen.append(step.ordinal)
        if step.ordinal < 3:
            raise Unavailable()
        return n * 2

    assert asyncio.run(answer(21)) == 42
    assert seen == [1, 2, 3]
    result = asyncio.run(answer.run_async(1))
    assert result.value == 2 and result.receipt["attempt_count"] == 3
    with pytest.raises(TypeError):
        answer.run(1)
