"""A history carrying an Anthropic thinking block, with a Gemini route: the
route is left out before any request (``provider_bound_history``), or the
block is dropped as the spec allows and Gemini receives a body without it;
never a 400 at dispatch."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

import pytest

import retryledger
from retryledger import providers

from provider_loopback import ProviderServer
from test_providers import GEMINI_OK, KEY, OVERLOADED, clients, spec

THINKING = {"type": "thinking", "thinking": "The deploy log shows a timeout.", "signature": "EqQBCkYIBxgCKkDx"}

HISTORY: Dict[str, Any] = {
    "schema": "retryledger.request.v1",
    "operation": "chat",
    "system": "You answer incident questions briefly.",
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What failed in the 02:00 deploy?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "provider_bound", "family": "anthropic", "kind": "thinking", "data": THINKING},
                {"type": "text", "text": "A migration timed out."},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "And the fix?"}]},
    ],
    "max_output_tokens": 512,
}


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: List[ProviderServer] = []

    def start(scripts: Dict[str, List[Dict[str, Any]]]) -> ProviderServer:
        servers.append(ProviderServer(scripts).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_a_gemini_only_spec_is_refused_before_any_request(serve: Any) -> None:
    server = serve({"google": [GEMINI_OK]})
    document = spec(["google"])
    with pytest.raises(retryledger.PolicyError) as info:
        providers.run(HISTORY, document, clients(server), KEY)
    assert info.value.code == "no_capable_route"
    assert retryledger.route_capabilities(HISTORY, document)["routes"] == [
        {"route_id": "google", "capable": False, "code": "provider_bound_history", "path": "/messages/1/content/0"}
    ]
    assert server.received == []


def test_dropping_is_the_spec_s_choice_and_gemini_gets_no_signature(serve: Any) -> None:
    server = serve({"google": [GEMINI_OK]})
    document = spec(["google"], provider_bound_parts="drop")
    result = providers.run(HISTORY, document, clients(server), KEY)
    [lowered] = retryledger.lower_routes(HISTORY, document)
    assert lowered["lowered"]["notes"] == [{"path": "/messages/1/content/0", "what": "dropped_provider_bound"}]
    [received] = server.bodies("google")
    assert received == lowered["lowered"]["body"]
    assert "signature" not in json.dumps(received) and "thoughtSignature" not in json.dumps(received)
    assert [c["role"] for c in received["contents"]] == ["user", "model", "user"]
    assert result.receipt["terminal"] == "completed"


def test_the_block_goes_to_anthropic_and_the_gemini_route_is_never_planned(serve: Any) -> None:
    server = serve({"anthropic": [OVERLOADED], "google": [GEMINI_OK]})
    document = spec(["anthropic", "google"], attempts={"anthropic": 1})
    routes = retryledger.route_capabilities(HISTORY, document)["routes"]
    assert [(r["route_id"], r["capable"], r.get("code")) for r in routes] == [
        ("anthropic", True, None),
        ("google", False, "provider_bound_history"),
    ]
    given = clients(server)
    del given["google"]  # a route left out needs no client
    with pytest.raises(retryledger.RunStoppedError) as info:
        providers.run(HISTORY, document, given, KEY)
    assert info.value.code == "stop_route_exhausted"
    assert [e["route_id"] for e in info.value.receipt["schedule"]] == ["anthropic"]
    [received] = server.bodies("anthropic")
    assert received["messages"][1]["content"][0] == THINKING
    assert server.bodies("google") == []
