"""Output checks and repair with the real ``openai`` and ``anthropic``
packages against a provider on 127.0.0.1: answers that arrive with HTTP 200
and are wrong (empty, unparsable JSON, failing a pydantic model, cut at the
token limit, refused) give their outcomes; a refusal never reaches the second
route; a repaired request reaches the server as a new request (its own body,
request digest and Idempotency-Key)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Optional, Tuple

import anthropic
import openai
import pytest
from pydantic import BaseModel

import retryledger
import retryledger.anthropic as rl_anthropic
import retryledger.openai as rl_openai
from retryledger import checks

from conftest import KEY, make_policy

PRIMARY, FALLBACK = "private-primary", "external-fallback"


class Summary(BaseModel):
    title: str
    severity: int


GOOD = '{"title": "disk full", "severity": 2}'


class Provider:
    """Each route answers its bodies in order (repeating the last), HTTP 200;
    every request is kept: (route, Idempotency-Key, JSON body)."""

    def __init__(self, answers: Dict[str, List[Dict[str, Any]]]) -> None:
        self.answers = answers
        self.requests: List[Tuple[str, Optional[str], Dict[str, Any]]] = []
        lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                route = self.path.split("/")[1]
                with lock:
                    n = sum(1 for r in provider.requests if r[0] == route)
                    provider.requests.append((route, self.headers.get("Idempotency-Key"), body))
                    script = provider.answers[route]
                    answer = script[min(n, len(script) - 1)]
                payload = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{route}"

    def count(self, route: str) -> int:
        return sum(1 for r in self.requests if r[0] == route)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[Provider] = []

    def start(answers: Dict[str, List[Dict[str, Any]]]) -> Provider:
        p = Provider(answers)
        servers.append(p)
        return p

    yield start
    for p in servers:
        p.stop()


def chat(content: Optional[str], finish: str = "stop", refusal: Optional[str] = None) -> Dict[str, Any]:
    message: Dict[str, Any] = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def message(text: Optional[str], stop: str = "end_turn") -> Dict[str, Any]:
    content = [] if text is None else [{"type": "text", "text": text}]
    return {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "fake-model", "content": content,
        "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def openai_clients(p: Provider) -> Dict[str, openai.OpenAI]:
    return {r: openai.OpenAI(base_url=p.url(r), api_key="test", max_retries=0) for r in (PRIMARY, FALLBACK)}


def anthropic_clients(p: Provider) -> Dict[str, anthropic.Anthropic]:
    return {r: anthropic.Anthropic(base_url=p.url(r), api_key="test", max_retries=0) for r in (PRIMARY, FALLBACK)}


def messages_of(step: retryledger.Step) -> List[Dict[str, Any]]:
    request = step.request
    return list(request["input"]) if request is not None else [{"role": "user", "content": "summarize INC-4471 as JSON"}]


def ask_openai(client: openai.OpenAI, step: retryledger.Step) -> Any:
    return client.chat.completions.create(model="fake-model", messages=messages_of(step), response_format={"type": "json_object"})  # type: ignore[call-overload]


def ask_anthropic(client: anthropic.Anthropic, step: retryledger.Step) -> Any:
    return client.messages.create(model="fake-model", max_tokens=256, messages=messages_of(step))  # type: ignore[arg-type]


CASES = [
    ("empty", chat(""), message(None), "empty", "invalid_output"),
    ("unparsable", chat('{"title": "disk'), message('{"title": "disk'), "unparsable_json", "invalid_output"),
    ("schema", chat('{"title": "disk full"}'), message('{"title": "disk full"}'), "schema", "invalid_output"),
    ("truncated", chat('{"title": "di', finish="length"), message('{"title": "di', stop="max_tokens"), "truncated", "invalid_output"),
    ("refusal", chat(None, refusal="I can't help with that."), message("I can't help with that.", stop="refusal"), "refusal", "policy_denied"),
]


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
@pytest.mark.parametrize("name,chat_answer,message_answer,kind,outcome", CASES, ids=[c[0] for c in CASES])
def test_a_wrong_answer_gives_its_outcome_and_never_reaches_the_fallback(
    serve: Any, sdk: str, name: str, chat_answer: Dict[str, Any], message_answer: Dict[str, Any], kind: str, outcome: str
) -> None:
    answer = chat_answer if sdk == "openai" else message_answer
    good = chat(GOOD) if sdk == "openai" else message(GOOD)
    p = serve({PRIMARY: [answer], FALLBACK: [good]})
    validators = [checks.pydantic_model(Summary)]
    with pytest.raises(retryledger.RunStoppedError) as e:
        if sdk == "openai":
            rl_openai.run(make_policy(), openai_clients(p), ask_openai, KEY, checks=rl_openai.answer_checks(json=True, validators=validators))
        else:
            rl_anthropic.run(make_policy(), anthropic_clients(p), ask_anthropic, KEY, checks=rl_anthropic.answer_checks(json=True, validators=validators))
    assert e.value.code == "stop_non_retryable"
    (attempt,) = e.value.bundle["attempts"]["attempts"]
    assert attempt["outcome"] == {"class": "non_retryable", "kind": outcome}
    assert attempt["output_check"]["kind"] == kind
    assert attempt["output_check"]["validator"].startswith(f"{sdk}.") or kind == "schema"
    assert (p.count(PRIMARY), p.count(FALLBACK)) == (1, 0)
    assert e.value.receipt["fallback_used"] is False


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_good_answer_completes(serve: Any, sdk: str) -> None:
    p = serve({PRIMARY: [chat(GOOD) if sdk == "openai" else message(GOOD)], FALLBACK: []})
    if sdk == "openai":
        r = rl_openai.run(make_policy(), openai_clients(p), ask_openai, KEY, checks=rl_openai.answer_checks(json=True, validators=[checks.pydantic_model(Summary)]))
    else:
        r = rl_anthropic.run(make_policy(), anthropic_clients(p), ask_anthropic, KEY, checks=rl_anthropic.answer_checks(json=True, validators=[checks.pydantic_model(Summary)]))
    assert r.terminal == "completed" and p.count(PRIMARY) == 1


def fix(output: Any, defects: List[Dict[str, Any]]) -> Dict[str, Any]:
    said = "; ".join(f"{d.get('path', '')} {d['message']}" for d in defects)
    return {
        "schema": "retryledger.request.v1",
        "operation": "chat",
        "input": [
            {"role": "user", "content": "summarize INC-4471 as JSON"},
            {"role": "user", "content": f"Your last answer was invalid ({said}). Answer again with title and severity."},
        ],
    }


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_repaired_request_reaches_the_server_as_a_new_request(serve: Any, sdk: str) -> None:
    bad, good = (chat('{"title": "disk full"}'), chat(GOOD)) if sdk == "openai" else (message('{"title": "disk full"}'), message(GOOD))
    p = serve({PRIMARY: [bad, good], FALLBACK: [good]})
    policy = make_policy(repair={"max_repairs": 1, "cost_share_percent": 50})
    if sdk == "openai":
        r = rl_openai.run(policy, openai_clients(p), ask_openai, KEY, checks=rl_openai.answer_checks(json=True, validators=[checks.pydantic_model(Summary)]), repair=fix)
    else:
        r = rl_anthropic.run(policy, anthropic_clients(p), ask_anthropic, KEY, checks=rl_anthropic.answer_checks(json=True, validators=[checks.pydantic_model(Summary)]), repair=fix)
    assert r.terminal == "completed"
    (first_route, first_key, first_body), (second_route, second_key, second_body) = p.requests
    assert (first_route, second_route) == (PRIMARY, PRIMARY) and p.count(FALLBACK) == 0
    # The same idempotency scope rules: the root's key, then the repair's own.
    assert first_key == KEY and second_key == f"{KEY}:repair:1"
    assert len(second_body["messages"]) == 2 and "/severity" in second_body["messages"][1]["content"]
    assert r.chain is not None
    chain: Dict[str, Any] = r.chain
    root, link = chain["links"]
    assert link["bundle"]["policy"]["logical_request_sha256"] == retryledger.request_sha256(fix(None, [{"path": "/severity", "message": "Field required"}]))
    assert link["bundle"]["policy"]["logical_request_sha256"] != root["bundle"]["policy"]["logical_request_sha256"]
    assert link["parent_request_sha256"] == root["bundle"]["policy"]["logical_request_sha256"]
    assert retryledger.verify_repair_chain(chain)["kind"] == "verified"
