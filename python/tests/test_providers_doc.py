"""docs/PROVIDERS.md prints the lowering table per wire: every field the
core's lowering writes for a rich request (top level, and Google's
``generationConfig``) is named in that wire's table, and the table names no
wire the core does not have."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Set

import pytest

import retryledger

from test_providers_bodies import RICH, WITH_STOP, one_route

ROOT = Path(__file__).resolve().parents[2]
WIRES = {
    "openai.chat_completions": "openai",
    "openai.responses": "openai",
    "anthropic.messages": "anthropic",
    "google.generate_content": "google",
}


def sections() -> Dict[str, str]:
    page = (ROOT / "docs/PROVIDERS.md").read_text()
    found = {}
    for m in re.finditer(r"^### `([a-z_.]+)` \(`core/src/lower/[a-z_]+\.rs`\)\n(.*?)(?=^### |\Z)", page, re.S | re.M):
        found[m.group(1)] = m.group(2)
    return found


def named(section: str) -> Set[str]:
    """Every name inside the section's code spans (``generationConfig.topP``
    names ``generationConfig`` and ``topP``)."""
    return {name for span in re.findall(r"`([^`]+)`", section) for name in re.findall(r"[A-Za-z_]+", span)}


def test_every_wire_has_a_section() -> None:
    assert set(sections()) == set(WIRES)


@pytest.mark.parametrize("api", sorted(WIRES))
def test_each_field_the_lowering_writes_is_in_its_wire_s_table(api: str) -> None:
    request = RICH if api == "openai.responses" else WITH_STOP
    variants = [request, {**request, "reasoning": {"effort": "low"}, "response_format": {"type": "json"}}]
    section = named(sections()[api])
    for r in variants:
        [lowered] = retryledger.lower_routes(r, one_route(WIRES[api], api))
        body = lowered["lowered"]["body"]
        fields = set(body) - {"model"}
        fields |= set(body.get("generationConfig", {}))
        missing = sorted(f for f in fields if f not in section)
        assert not missing, f"{api}: docs/PROVIDERS.md does not name {missing}"
