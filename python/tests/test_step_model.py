"""``step.set_model(requested, served)`` records which model an attempt asked
for and which answered, the same on the plain driver (the Session) and the
journaled one (the run machine's ``observed`` event): the receipt names
both, a side not given stays absent, and both bundles are byte-identical."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

import retryledger
from retryledger.journaled import run_journaled
from retryledger.stores import MemoryStore

from conftest import KEY, FakeClock, make_policy


def scripted(clock: FakeClock) -> Any:
    def dispatch(step: Any) -> str:
        clock.advance(100)
        if step.ordinal == 1:
            step.set_model("gpt-4.1")
            raise retryledger.AttemptError.retryable("unavailable")
        if step.ordinal == 2:
            raise retryledger.AttemptError.retryable("unavailable")
        step.set_model("claude-sonnet-4-5", "claude-sonnet-4-5-20250929")
        return "ok"

    return dispatch


def models(bundle: Dict[str, Any]) -> List[Any]:
    return [e.get("model") for e in bundle["receipt"]["schedule"]]


def test_the_plain_and_the_journaled_driver_record_the_same_models() -> None:
    policy = retryledger.Policy(make_policy())
    clock = FakeClock()
    plain = retryledger.run(policy, scripted(clock), KEY, clock=clock, sleep=clock.sleep)
    assert models(plain.bundle) == [
        {"requested": "gpt-4.1"},
        None,
        {"requested": "claude-sonnet-4-5", "served": "claude-sonnet-4-5-20250929"},
    ]
    clock = FakeClock()
    clock.now = 1_780_000_000_000
    journaled = run_journaled(
        policy, scripted(clock), KEY, store=MemoryStore(), run_id="r-1", clock=clock, sleep=clock.sleep
    )
    assert journaled.bundle_json == plain.bundle_json
    assert retryledger.verify_bundle(plain.bundle)["kind"] == "verified"


def test_a_requested_model_that_is_not_an_identifier_is_a_coded_error() -> None:
    policy = retryledger.Policy(make_policy())

    def dispatch(step: Any) -> str:
        step.set_model("gpt 4.1")
        return "ok"

    # Raised out of dispatch, like usage the core refuses: the run ends as an
    # unrecognized error whose cause is the coded one, never retried.
    with pytest.raises(retryledger.UnrecognizedDispatchError) as info:
        retryledger.run(policy, dispatch, KEY)
    cause = info.value.__cause__
    assert isinstance(cause, retryledger.DecodeError) and cause.code == "invalid_identifier"


def test_a_served_name_outside_the_identifier_alphabet_is_recorded_as_unknown() -> None:
    policy = retryledger.Policy(make_policy())

    def dispatch(step: Any) -> str:
        step.set_model("gpt-4.1", "gpt 4.1 (preview)")
        return "ok"

    result = retryledger.run(policy, dispatch, KEY)
    assert models(result.bundle) == [{"requested": "gpt-4.1"}]
