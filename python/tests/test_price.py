"""Price schedules in the drivers: usage reported on a step is charged the
core's price on the step's route release, an unreported attempt keeps its
reservation, a schedule that does not fit the policy is refused before any
dispatch, and usage the schedule does not price raises the core's coded
error. The openai and anthropic integrations charge the usage of the
responses they return, against a loopback provider.

The policy and schedule are the first case of tests/vectors/price.json, so
the route release digests are the schedule's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any, Dict, Iterator, List

import anthropic
import openai
import pytest

import retryledger
import retryledger.anthropic as rl_anthropic
import retryledger.openai as rl_openai
from retryledger import AttemptError, Step

from conftest import KEY, ROOT, FakeClock
from loopback import Reply, ScriptedServer

CASES = {case["name"]: case for case in json.loads((ROOT / "tests/vectors/price.json").read_text())["cases"]}
_FIRST = CASES["price_schedule_prices_every_route"]["input"]
POLICY: Dict[str, Any] = json.loads(_FIRST["policy"])
SCHEDULE: Dict[str, Any] = json.loads(_FIRST["schedule"])
PRIMARY = POLICY["routes"][0]["route_release_sha256"]  # prices input and output
FALLBACK = POLICY["routes"][1]["route_release_sha256"]  # prices input, cached_input, output, reasoning
RESERVE = {r["route_id"]: r["reserve_cost"] for r in POLICY["routes"]}
REFUSED = [("price_schedule_missing_release", "price_schedule_missing_release"), ("price_schedule_other_cost_unit", "cost_unit_mismatch")]


def costs(result: Any) -> List[int]:
    return [a["cost"] for a in result.bundle["attempts"]["attempts"]]


def routes(result: Any) -> List[str]:
    return [a["route_id"] for a in result.bundle["attempts"]["attempts"]]


# ---- the drivers --------------------------------------------------------------


def test_the_vectors_policy_and_schedule_fit() -> None:
    assert retryledger.check_price_schedule(POLICY, SCHEDULE) == CASES["price_schedule_prices_every_route"]["expect"]["ok"]


def test_reported_usage_is_charged_the_core_price_and_unreported_keeps_its_reservation() -> None:
    clock = FakeClock()
    first = {"input": 1000, "output": 500}
    last = {"input": 1000, "cached_input": 200, "output": 300, "reasoning": 100}

    def dispatch(step: Step) -> str:
        if step.ordinal == 1:
            step.usage(first)
            raise AttemptError.retryable("unavailable")
        if step.ordinal == 2:
            raise AttemptError.retryable("unavailable")  # no usage reported
        step.usage(last)
        return "ok"

    result = retryledger.run(POLICY, dispatch, KEY, clock=clock, sleep=clock.sleep, price_schedule=SCHEDULE)
    assert result.value == "ok"
    assert routes(result) == ["private-primary", "private-primary", "external-fallback"]
    expected_first = retryledger.price_cost(SCHEDULE, PRIMARY, first)
    expected_last = retryledger.price_cost(SCHEDULE, FALLBACK, last)
    assert expected_first == 50 + 100  # 1000 * 0.05 + 500 * 0.2
    assert expected_last == 150 + 15 + 180 + 60
    assert costs(result) == [expected_first, RESERVE["private-primary"], expected_last]


def test_usage_reports_add_up_and_exclude_a_hand_charge_in_the_async_driver() -> None:
    clock = FakeClock()
    usage = {"input": 7, "output": 3}
    refused: List[str] = []

    async def dispatch(step: Step) -> str:
        step.usage(usage)
        step.usage(usage)
        try:
            step.charge(10)
        except retryledger.PolicyError as e:
            refused.append(e.code)
        return "ok"

    result = asyncio.run(
        retryledger.run_async(POLICY, dispatch, KEY, clock=clock, sleep=clock.async_sleep, price_schedule=SCHEDULE)
    )
    # Priced once on the summed units (7+7 input, 3+3 output), not per report.
    both = retryledger.price_cost(SCHEDULE, PRIMARY, {"input": 14, "output": 6})
    assert both == 1 + 2  # ceil(14 * 0.05), ceil(6 * 0.2)
    assert costs(result) == [both]
    assert refused == ["charge_with_usage"]
    [attempt] = result.bundle["attempts"]["attempts"]
    assert attempt["usage"] == {"input": 14, "output": 6}
    assert result.receipt["price_schedule_sha256"] == retryledger.digest(SCHEDULE)
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"


def test_a_hand_charge_excludes_usage_on_the_same_attempt() -> None:
    refused: List[str] = []

    def dispatch(step: Step) -> str:
        step.charge(10)
        try:
            step.usage({"input": 1})
        except retryledger.PolicyError as e:
            refused.append(e.code)
        return "ok"

    result = retryledger.run(POLICY, dispatch, KEY, price_schedule=SCHEDULE)
    assert refused == ["charge_with_usage"]
    assert costs(result) == [10]
    assert "usage" not in result.bundle["attempts"]["attempts"][0]


def test_a_request_body_is_recorded_and_must_not_change_on_a_retry() -> None:
    clock = FakeClock()
    body = b'{"model":"m","input":"hi"}'

    def same(step: Step) -> str:
        step.request_body(body)
        if step.ordinal == 1:
            raise AttemptError.retryable("unavailable")
        return "ok"

    result = retryledger.run(POLICY, same, KEY, clock=clock, sleep=clock.sleep)
    digests = [a["request_body_sha256"] for a in result.bundle["attempts"]["attempts"]]
    assert digests == [hashlib.sha256(body).hexdigest()] * 2
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"

    def drifting(step: Step) -> str:
        step.request_body(body if step.ordinal == 1 else body + b" ")
        if step.ordinal == 1:
            raise AttemptError.retryable("unavailable")
        return "ok"

    with pytest.raises(retryledger.DriftError) as raised:
        retryledger.run(POLICY, drifting, KEY, clock=clock, sleep=clock.sleep)
    assert raised.value.code == "request_body_drift"


def test_a_string_schedule_is_accepted() -> None:
    def dispatch(step: Step) -> None:
        step.usage({"input": 20})

    result = retryledger.run(POLICY, dispatch, KEY, price_schedule=_FIRST["schedule"])
    assert costs(result) == [1]


@pytest.mark.parametrize("name,code", REFUSED)
def test_a_schedule_that_does_not_fit_is_refused_before_any_dispatch(name: str, code: str) -> None:
    case = CASES[name]["input"]
    calls: List[Step] = []

    def dispatch(step: Step) -> None:
        calls.append(step)

    async def dispatch_async(step: Step) -> None:
        calls.append(step)

    with pytest.raises(retryledger.PolicyError) as raised:
        retryledger.run(case["policy"], dispatch, KEY, price_schedule=case["schedule"])
    assert raised.value.code == code == CASES[name]["expect"]["error"]["code"]
    with pytest.raises(retryledger.PolicyError) as raised:
        asyncio.run(retryledger.run_async(case["policy"], dispatch_async, KEY, price_schedule=case["schedule"]))
    assert raised.value.code == code
    assert calls == []


def test_usage_without_a_schedule_is_a_coded_error() -> None:
    seen: List[BaseException] = []

    def dispatch(step: Step) -> str:
        try:
            step.usage({"input": 1})
        except retryledger.PolicyError as e:
            seen.append(e)
        return "ok"

    result = retryledger.run(POLICY, dispatch, KEY)
    [error] = seen
    assert isinstance(error, retryledger.PolicyError)
    assert error.code == "price_schedule_missing_release"
    assert "no price schedule" in str(error)
    assert costs(result) == [RESERVE["private-primary"]]


@pytest.mark.parametrize(
    "usage,error,code",
    [
        ({"reasoning": 5}, retryledger.PolicyError, "usage_unpriced"),
        ({"input": -1}, retryledger.DecodeError, "integer_out_of_range"),
        ({"input": 1.5}, retryledger.DecodeError, "float_value"),
    ],
)
def test_bad_usage_raises_from_step_usage_and_charges_nothing(usage: Dict[str, Any], error: type, code: str) -> None:
    seen: List[BaseException] = []

    def dispatch(step: Step) -> str:
        try:
            step.usage(usage)
        except retryledger.RetryledgerError as e:
            seen.append(e)
        assert step.cost == step.reserve_cost
        return "ok"

    result = retryledger.run(POLICY, dispatch, KEY, price_schedule=SCHEDULE)
    [raised] = seen
    assert isinstance(raised, error)
    assert getattr(raised, "code") == code
    assert costs(result) == [RESERVE["private-primary"]]


def test_bad_usage_raised_out_of_dispatch_ends_the_run_with_it_as_cause() -> None:
    def dispatch(step: Step) -> str:
        step.usage({"reasoning": 5})  # the primary release does not price reasoning
        return "ok"

    with pytest.raises(retryledger.UnrecognizedDispatchError) as raised:
        retryledger.run(POLICY, dispatch, KEY, price_schedule=SCHEDULE)
    cause = raised.value.__cause__
    assert isinstance(cause, retryledger.PolicyError) and cause.code == "usage_unpriced"
    assert len(raised.value.bundle["attempts"]["attempts"]) == 1


# ---- the integrations -----------------------------------------------------------


CHAT_USAGE: Dict[str, Any] = {
    "prompt_tokens": 1200,
    "completion_tokens": 300,
    "total_tokens": 1500,
    "prompt_tokens_details": {"cached_tokens": 200},
    "completion_tokens_details": {"reasoning_tokens": 100},
}
CHAT_UNITS = {"input": 1000, "cached_input": 200, "output": 200, "reasoning": 100}
PLAIN_CHAT_USAGE: Dict[str, Any] = {
    "prompt_tokens": 30,
    "completion_tokens": 12,
    "total_tokens": 42,
    "prompt_tokens_details": {"cached_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0},
}


def completion(usage: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "severity: high"}, "finish_reason": "stop"}],
        "usage": usage,
    }


def chat_body(usage: Dict[str, Any]) -> Any:
    def body(status: int) -> Any:
        return completion(usage) if status == 200 else {"error": {"message": f"status {status}"}}

    return body


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ScriptedServer] = []

    def start(scripts: Dict[str, List[Reply]], body: Any) -> ScriptedServer:
        servers.append(ScriptedServer(scripts, body).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def openai_clients(server: ScriptedServer) -> Dict[str, openai.OpenAI]:
    return {
        "private-primary": openai.OpenAI(api_key="test", base_url=server.url("primary") + "/v1", max_retries=0),
        "external-fallback": openai.OpenAI(api_key="test", base_url=server.url("fallback") + "/v1", max_retries=0),
    }


def ask(client: openai.OpenAI, step: Step) -> Any:
    return client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "INC-4471"}])


def test_usage_units_of_both_openai_apis() -> None:
    assert rl_openai.usage_units(completion(CHAT_USAGE)) == CHAT_UNITS
    assert rl_openai.usage_units(completion(PLAIN_CHAT_USAGE)) == {"input": 30, "output": 12}
    responses = {
        "usage": {
            "input_tokens": 1200,
            "output_tokens": 300,
            "total_tokens": 1500,
            "input_tokens_details": {"cached_tokens": 200},
            "output_tokens_details": {"reasoning_tokens": 100},
        }
    }
    assert rl_openai.usage_units(responses) == CHAT_UNITS
    assert rl_openai.usage_units({"usage": {"input_tokens": 5, "output_tokens": 0}}) == {"input": 5}
    assert rl_openai.usage_units("severity: high") is None
    assert rl_openai.usage_units({"usage": None}) is None


def test_openai_charges_the_usage_of_each_response(serve: Any) -> None:
    server = serve({"primary": [(503, {"retry-after-ms": "0"})], "fallback": [(200, {})]}, chat_body(CHAT_USAGE))
    result = rl_openai.run(POLICY, openai_clients(server), ask, KEY, price_schedule=SCHEDULE)
    assert result.value.choices[0].message.content == "severity: high"
    assert routes(result) == ["private-primary", "private-primary", "external-fallback"]
    charged = retryledger.price_cost(SCHEDULE, FALLBACK, CHAT_UNITS)
    assert charged == 150 + 15 + 120 + 60
    # The 503s carry no usage: they keep their reservation.
    assert costs(result) == [RESERVE["private-primary"], RESERVE["private-primary"], charged]


def test_openai_charges_only_nonzero_kinds_so_a_schedule_without_reasoning_works(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]}, chat_body(PLAIN_CHAT_USAGE))
    result = rl_openai.run(POLICY, openai_clients(server), ask, KEY, price_schedule=SCHEDULE)
    assert costs(result) == [retryledger.price_cost(SCHEDULE, PRIMARY, {"input": 30, "output": 12})] == [2 + 3]


def test_openai_without_a_schedule_keeps_the_reservation(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]}, chat_body(CHAT_USAGE))
    result = rl_openai.run(POLICY, openai_clients(server), ask, KEY)
    assert costs(result) == [RESERVE["private-primary"]]


def test_openai_unpriced_usage_is_not_dropped(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]}, chat_body(CHAT_USAGE))
    with pytest.raises(retryledger.UnrecognizedDispatchError) as raised:
        rl_openai.run(POLICY, openai_clients(server), ask, KEY, price_schedule=SCHEDULE)
    cause = raised.value.__cause__
    assert isinstance(cause, retryledger.PolicyError) and cause.code == "usage_unpriced"


@pytest.mark.parametrize("name,code", REFUSED)
def test_openai_refuses_a_schedule_before_any_request(serve: Any, name: str, code: str) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]}, chat_body(CHAT_USAGE))
    case = CASES[name]["input"]
    with pytest.raises(retryledger.PolicyError) as raised:
        rl_openai.run(case["policy"], openai_clients(server), ask, KEY, price_schedule=case["schedule"])
    assert raised.value.code == code
    assert server.count() == 0


def test_openai_async_charges_the_usage(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]}, chat_body(PLAIN_CHAT_USAGE))
    clients = {
        "private-primary": openai.AsyncOpenAI(api_key="test", base_url=server.url("primary") + "/v1", max_retries=0),
        "external-fallback": openai.AsyncOpenAI(api_key="test", base_url=server.url("fallback") + "/v1", max_retries=0),
    }

    async def ask_async(client: openai.AsyncOpenAI, step: Step) -> Any:
        return await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])

    result = asyncio.run(rl_openai.run_async(POLICY, clients, ask_async, KEY, price_schedule=SCHEDULE))
    assert costs(result) == [5]


def message(usage: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "fake-model",
        "content": [{"type": "text", "text": "severity: high"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


def anthropic_body(usage: Dict[str, Any]) -> Any:
    def body(status: int) -> Any:
        if status == 200:
            return message(usage)
        return {"type": "error", "error": {"type": "api_error", "message": f"status {status}"}}

    return body


def ask_anthropic(client: anthropic.Anthropic, step: Step) -> Any:
    return client.messages.create(model="fake-model", max_tokens=64, messages=[{"role": "user", "content": "x"}])


def anthropic_clients(server: ScriptedServer) -> Dict[str, anthropic.Anthropic]:
    return {
        "private-primary": anthropic.Anthropic(api_key="test", base_url=server.url("primary"), max_retries=0),
        "external-fallback": anthropic.Anthropic(api_key="test", base_url=server.url("fallback"), max_retries=0),
    }


def test_anthropic_usage_units() -> None:
    usage = {"input_tokens": 40, "output_tokens": 9, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 0}
    assert rl_anthropic.usage_units(message(usage)) == {"input": 40, "cached_input": 300, "output": 9}
    assert rl_anthropic.usage_units(message({"input_tokens": 3, "output_tokens": 2})) == {"input": 3, "output": 2}
    assert rl_anthropic.usage_units(message({"input_tokens": 3, "cache_creation_input_tokens": 8})) == {
        "input": 3,
        "cache_creation_input": 8,
    }
    assert rl_anthropic.usage_units("severity: high") is None


def test_anthropic_charges_the_usage_of_each_message(serve: Any) -> None:
    usage = {"input_tokens": 1000, "output_tokens": 500, "cache_read_input_tokens": 400}
    server = serve({"primary": [(503, {"retry-after-ms": "0"})], "fallback": [(200, {})]}, anthropic_body(usage))
    result = rl_anthropic.run(POLICY, anthropic_clients(server), ask_anthropic, KEY, price_schedule=SCHEDULE)
    charged = retryledger.price_cost(SCHEDULE, FALLBACK, {"input": 1000, "cached_input": 400, "output": 500})
    assert charged == 150 + 30 + 300
    assert costs(result) == [RESERVE["private-primary"], RESERVE["private-primary"], charged]


def test_anthropic_async_charges_the_usage(serve: Any) -> None:
    server = serve({"primary": [(200, {})], "fallback": [(200, {})]}, anthropic_body({"input_tokens": 3, "output_tokens": 2}))
    clients = {
        "private-primary": anthropic.AsyncAnthropic(api_key="test", base_url=server.url("primary"), max_retries=0),
        "external-fallback": anthropic.AsyncAnthropic(api_key="test", base_url=server.url("fallback"), max_retries=0),
    }

    async def ask_async(client: anthropic.AsyncAnthropic, step: Step) -> Any:
        return await client.messages.create(model="fake-model", max_tokens=64, messages=[{"role": "user", "content": "x"}])

    result = asyncio.run(rl_anthropic.run_async(POLICY, clients, ask_async, KEY, price_schedule=SCHEDULE))
    assert costs(result) == [retryledger.price_cost(SCHEDULE, PRIMARY, {"input": 3, "output": 2})] == [1 + 1]
