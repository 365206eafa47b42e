"""Shared by the framework adapters' tests: a policy spec with an openai route
and an anthropic route, and the loopback counts a receipt must match."""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List

from sse_loopback import SSEServer

from conftest import ROOT

_BUILDER = json.loads((ROOT / "tests/vectors/builder.json").read_text())["cases"]
_BASE = next(c for c in _BUILDER if c["name"] == "build_reference_spec")

OPENAI_ROUTE = "openai-primary"
ANTHROPIC_ROUTE = "anthropic-fallback"


def spec(**overrides: Any) -> Dict[str, Any]:
    """The builder's reference spec with two routes: openai (priority 0) and
    anthropic, two attempts each, short backoff; no key digest (per call)."""
    document: Dict[str, Any] = json.loads(_BASE["input"]["spec"])
    del document["idempotency_key_sha256"]
    first, second = copy.deepcopy(document["routes"])
    first["route_id"] = OPENAI_ROUTE
    first["release"] = {**first["release"], "provider": "openai", "model": "gpt-fake"}
    second["route_id"] = ANTHROPIC_ROUTE
    second["release"] = {**second["release"], "provider": "anthropic", "model": "claude-fake",
                         "endpoint": "https://api.anthropic.example/v1/messages"}
    second["data_boundary"] = "external_provider"
    document["routes"] = [first, second]
    document["backoff"] = {"base_ms": 10, "max_ms": 50, "retry_after_cap_ms": 2_000}
    document["deadline_ms"] = 20_000
    document.update(overrides)
    return document


def attempts_of(receipt_or_bundle: Dict[str, Any]) -> List[Dict[str, Any]]:
    attempts: List[Dict[str, Any]] = receipt_or_bundle["attempts"]["attempts"]
    return attempts


def physical(server: SSEServer) -> int:
    """Requests the loopback server counted."""
    return server.count()


def routes_of(server: SSEServer) -> List[str]:
    with server.lock:
        return [r.route for r in server.requests]
