"""One logical request lowered per route: each body's digest is recomputed
here from the body itself, and a history bound to Anthropic is refused on a
Gemini-only route unless dropping is allowed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import retryledger

ROOT = Path(__file__).resolve().parents[2]
CASES = {c["name"]: c for c in json.loads((ROOT / "tests/vectors/lowering.json").read_text())["cases"]}


def jcs(value: Any) -> str:
    # Integers and strings only in these bodies, so sorted compact JSON is RFC 8785.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("name", ["lower_chat_tools_history", "lower_anthropic_bound_anthropic_kept", "lower_google_images"])
def test_the_body_digest_is_the_body_s(name: str) -> None:
    inp = CASES[name]["input"]
    lowered = retryledger.lower_request(inp["request"], inp["release"], inp["options"])
    assert lowered["body_sha256"] == hashlib.sha256(jcs(lowered["body"]).encode()).hexdigest()
    again = retryledger.lower_request(json.loads(inp["request"]), json.loads(inp["release"]))
    assert again == lowered


def test_a_thinking_block_on_a_gemini_only_route_is_refused_or_dropped() -> None:
    inp = CASES["lower_google_bound_anthropic_refused"]["input"]
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.lower_request(inp["request"], inp["release"])
    assert e.value.code == "provider_bound_history"
    assert e.value.path == "/messages/1/content/0"
    dropped = retryledger.lower_request(inp["request"], inp["release"], {"provider_bound_parts": "drop"})
    assert "thoughtSignature" not in json.dumps(dropped["body"]) and "signature" not in json.dumps(dropped["body"])
    assert dropped["notes"] == [{"path": "/messages/1/content/0", "what": "dropped_provider_bound"}]


def test_no_capable_route_before_any_dispatch() -> None:
    inp = CASES["build_thinking_history_gemini_only_refused"]["input"]
    with pytest.raises(retryledger.PolicyError) as e:
        retryledger.build_policy(inp["request"], inp["spec"])
    assert e.value.code == "no_capable_route"
    report = retryledger.route_capabilities(inp["request"], inp["spec"])
    assert report["routes"] == [
        {"capable": False, "code": "provider_bound_history", "path": "/messages/1/content/0", "route_id": "route-0"}
    ]
