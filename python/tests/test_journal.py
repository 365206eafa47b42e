"""Durable runs through the package's public functions: a journal written with
journal_append, a crash after the dispatch, recovery by a new owner under a
higher lease generation, the fenced owner's late append, and the exception
classes of the journal and idempotency families."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List

import pytest

import retryledger
from retryledger.journal import (
    idempotency_claim,
    idempotency_complete,
    journal_append,
    journal_classify,
    journal_recover,
    journal_verify,
)

from conftest import make_policy

RUN = "run-journal-test"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _crashed_after_dispatch(policy: Dict[str, Any], generation: int) -> List[Dict[str, Any]]:
    events: List[Dict[str, Any]] = []
    for entry in (
        {"kind": "created", "run_id": RUN, "created_at_epoch_ms": 1_780_000_000_000},
        {"kind": "decided"},
        {"kind": "reserved"},
        {"kind": "dispatched", "started_at_ms": 0},
    ):
        events.append(journal_append(policy, events, generation, entry))
    return events


def test_a_dispatched_attempt_is_reconciled_and_adopted_by_the_new_owner() -> None:
    policy = make_policy()
    events = _crashed_after_dispatch(policy, 1)
    assert events[0]["prev_sha256"] == "0" * 64
    assert events[1]["prev_sha256"] == retryledger.digest(events[0])
    ask = journal_recover(policy, events)
    assert ask["kind"] == "reconcile" and ask["attempt"]["ordinal"] == 1
    answers: Dict[str, Any] = {
        "schema": "retryledger.reconciliation.v1",
        "ordinal": 1,
        "max_polls": 3,
        "answers": [{"answer": "in_progress", "at_ms": 300}],
    }
    poll = journal_recover(policy, events, answers)
    assert (poll["kind"], poll["not_before_ms"]) == ("reconcile", 400)
    answers["answers"].append({"answer": "succeeded", "at_ms": 450})
    adopt = journal_recover(policy, events, answers)
    assert adopt["kind"] == "adopt" and adopt["attempt"]["reconciled"] == "succeeded"
    taken = list(events)
    for entry in ({"kind": "observed", "attempt": adopt["attempt"]}, {"kind": "decided"}, {"kind": "terminal"}):
        taken.append(journal_append(policy, taken, 2, entry))
    verified = journal_verify(policy, taken)
    assert (verified["terminal"], verified["lease_generation"]) == ("completed", 2)
    assert journal_recover(policy, taken)["kind"] == "done"
    late = dict(taken[4], lease_generation=1)
    assert journal_classify(policy, taken, late) == {
        "kind": "evidence",
        "lease_generation": 2,
        "reason": "stale_lease",
        "seq": 4,
    }
    with pytest.raises(retryledger.JournalError) as info:
        journal_append(policy, taken[:5], 1, {"kind": "decided"})
    assert (info.value.code, info.value.path) == ("journal_stale_lease", "/entry/lease_generation")


def test_a_tampered_chain_is_a_journal_error_with_its_path() -> None:
    policy = make_policy()
    events = _crashed_after_dispatch(policy, 1)
    events[2] = dict(events[2], prev_sha256="ab" * 32)
    with pytest.raises(retryledger.JournalError) as info:
        journal_verify(policy, events)
    assert (info.value.code, info.value.path) == ("journal_chain_broken", "/events/2/prev_sha256")


def test_idempotency_records_claim_complete_replay() -> None:
    retention = {"expired": "reject", "poll_after_ms": 500, "ttl_ms": 60_000}
    key = retryledger.idempotency_key_sha256("k-1", tenant="t", operation="op")
    request = {"idempotency_key_sha256": key, "request_sha256": _sha("body")}
    claimed = idempotency_claim(retention, None, request, 1_000)
    assert claimed["kind"] == "proceed"
    assert idempotency_claim(retention, claimed["record"], request, 1_100) == {
        "kind": "poll",
        "poll_at_epoch_ms": 1_600,
        "retry_after_ms": 500,
    }
    done = idempotency_complete(
        retention, claimed["record"], dict(request, status="succeeded", result_sha256=_sha("result")), 2_000
    )
    assert idempotency_claim(retention, done, request, 3_000) == {"kind": "replay", "result_sha256": _sha("result")}
    other = dict(request, request_sha256=_sha("another body"))
    assert idempotency_claim(retention, done, other, 3_000) == {"kind": "rejected", "reason": "key_reuse"}
    with pytest.raises(retryledger.IdempotencyError) as info:
        idempotency_complete(retention, done, dict(request, status="failed_no_effect"), 3_000)
    assert info.value.code == "idempotency_not_in_progress"
    with pytest.raises(retryledger.DecodeError):
        idempotency_claim(retention, None, request, -1)


def test_a_compiled_policy_gives_the_journal_calls_the_same_answers_as_its_text() -> None:
    document = make_policy()
    compiled = retryledger.Policy(document)
    events = _crashed_after_dispatch(document, 1)
    late = dict(events[3], lease_generation=0)
    for policy in (document, compiled):
        assert journal_verify(policy, events) == journal_verify(document, events)
        assert journal_recover(policy, events) == journal_recover(document, events)
        assert journal_classify(policy, events, late) == journal_classify(document, events, late)
        assert journal_append(policy, events[:1], 1, {"kind": "decided"}) == events[1]
    # Refusals are the same through either: an entry out of order, a tampered chain.
    refused = []
    tampered = [dict(e) for e in events]
    tampered[2]["prev_sha256"] = "0" * 64
    for policy in (document, compiled):
        with pytest.raises(retryledger.JournalError) as out_of_order:
            journal_append(policy, events, 1, {"kind": "decided"})
        with pytest.raises(retryledger.JournalError) as broken:
            journal_verify(policy, tampered)
        refused.append([(e.value.code, e.value.path) for e in (out_of_order, broken)])
    assert refused[0] == refused[1]
    assert refused[0][0][0] == "journal_out_of_order"


def test_a_writer_builds_the_events_journal_append_builds() -> None:
    """A writer taken over at every prefix of a journal builds the rest
    event for event, recovers and resumes a session as the stateless calls
    do, and refuses what journal_append refuses, with the same code and path."""
    document = make_policy()
    policy = retryledger.Policy(document)
    events = _crashed_after_dispatch(document, 1)
    entries: List[Dict[str, Any]] = [
        {"kind": "created", "run_id": RUN, "created_at_epoch_ms": 1_780_000_000_000},
        {"kind": "decided"},
        {"kind": "reserved"},
        {"kind": "dispatched", "started_at_ms": 0},
    ]
    for cut in range(len(events) + 1):
        writer = retryledger.JournalWriter(policy, events[:cut], 1)
        assert writer.next_seq == cut
        for k in range(cut, len(events)):
            assert writer.append(entries[k]) == events[k]
            assert writer.recover() == journal_recover(policy, events[: k + 1])
        assert writer.next_seq == len(events)
    # The session it resumes is the one resume_journal gives.
    resumed = policy.session()
    resumed.resume_journal(json.dumps(events))
    continued = policy.session()
    writer.resume(continued)
    assert continued.attempts == resumed.attempts
    assert continued.next().to_dict() == resumed.next().to_dict()
    # Refusals: an entry out of order, a lower lease generation, a session of
    # another policy, a broken journal given to the constructor.
    with pytest.raises(retryledger.JournalError) as out_of_order:
        writer.append({"kind": "decided"})
    with pytest.raises(retryledger.JournalError) as stateless:
        journal_append(policy, events, 1, {"kind": "decided"})
    assert (out_of_order.value.code, out_of_order.value.path) == (stateless.value.code, stateless.value.path)
    assert writer.next_seq == len(events)  # a refused entry leaves the writer as it was
    with pytest.raises(retryledger.JournalError) as stale:
        retryledger.JournalWriter(policy, events[:2], 0).append({"kind": "reserved"})
    assert (stale.value.code, stale.value.path) == ("journal_stale_lease", "/entry/lease_generation")
    other = retryledger.Policy(make_policy(deadline_ms=9_000))
    with pytest.raises(retryledger.JournalError) as mismatch:
        writer.resume(other.session())
    assert mismatch.value.code == "journal_policy_mismatch"
    tampered = [dict(e) for e in events]
    tampered[2]["prev_sha256"] = "ab" * 32
    with pytest.raises(retryledger.JournalError) as broken:
        retryledger.JournalWriter(policy, tampered, 1)
    assert (broken.value.code, broken.value.path) == ("journal_chain_broken", "/events/2/prev_sha256")
    with pytest.raises(retryledger.DecodeError):
        retryledger.JournalWriter(policy, events, -1)
