"""Facts the core refuses fall back to what is certain, in both drivers alike:
raised, cancelled, output delivered (wasm/ts/facts.ts `minimalFacts`)."""

from __future__ import annotations

import retryledger


class Bad(Exception):
    code = "E\ud800"  # an unpaired surrogate: not a string the core accepts


def test_refused_facts_keep_output_delivered() -> None:
    bad = Bad
    facts = retryledger.facts_of(bad(), output_delivered=True, now_unix_ms=0)
    assert retryledger.judge(facts)["rule"] == "output_delivered"
    facts = retryledger.facts_of(bad(), now_unix_ms=0)
    assert retryledger.judge(facts)["rule"] == "unrecognized"
    facts = retryledger.facts_of(bad(), cancelled=True, output_delivered=True, now_unix_ms=0)
    assert retryledger.judge(facts)["outcome"] == {"class": "indeterminate", "kind": "stream_interrupted_after_output"}
