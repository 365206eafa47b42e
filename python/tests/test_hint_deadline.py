"""A Retry-After hint that reaches the deadline stops the run at once
(``stop_deadline``), without sleeping until the hint or the deadline; under
every ``retry_after_over_cap`` choice."""

from __future__ import annotations

from typing import List

import pytest

import retryledger
from retryledger import AttemptError, RunStoppedError, Step

from conftest import KEY, FakeClock, make_policy


@pytest.mark.parametrize("over_cap", ["clamp", "skip_route", "stop"])
def test_a_hint_reaching_the_deadline_stops_without_sleeping(over_cap: str) -> None:
    # Deadline 1,500 ms, cap 2,000 ms: a 1,800 ms hint (under the cap) after
    # an attempt at 0 would start the retry past the deadline.
    policy = make_policy(
        deadline_ms=1_500, backoff={"base_ms": 100, "max_ms": 1000, "retry_after_cap_ms": 2000, "retry_after_over_cap": over_cap}
    )
    clock = FakeClock()
    calls: List[int] = []

    def dispatch(step: Step) -> str:
        calls.append(step.started_at_ms)
        clock.advance(10)
        raise AttemptError.retryable("rate_limited", retry_after_ms=1_800)

    with pytest.raises(RunStoppedError) as e:
        retryledger.run(policy, dispatch, KEY, clock=clock, sleep=clock.sleep)
    assert e.value.terminal == "stop_deadline"
    assert calls == [0] and clock.sleeps == [] and clock.now == 10
