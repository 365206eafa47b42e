"""Durable runs and idempotency records: thin wrappers over the core's pure
transitions (docs/JOURNAL.md). A host reads its store, asks the core and writes
the answer back: an event appended at its ``seq`` (the append fails when the
seq is taken), a record written by compare-and-set.

- :func:`journal_append` builds the next ``retryledger.journal_event.v1`` of a
  run's journal (its ``seq``, ``prev_sha256`` and the core's part of the
  payload) from an entry such as ``{"kind": "dispatched", "started_at_ms": 1350}``;
- :func:`journal_verify` replays a journal against the policy;
- :func:`journal_recover` says what a new owner does: ``resume``, ``reconcile``
  (ask the receiver by idempotency key), ``adopt`` (the receiver's settled
  answer as the attempt's observation) or ``done``;
- :func:`journal_classify` tells a fenced owner's late append (evidence) from a
  valid one;
- :class:`JournalWriter` is the owner's writer of one run's journal: it keeps
  the replay between appends, so each event is checked alone (``journal_append``
  replays the whole journal every time);
- :func:`idempotency_claim` / :func:`idempotency_complete`: the receiver's record
  per scoped key (``retryledger.idempotency_record.v1``).

Documents may be given as mappings, JSON text or UTF-8 bytes; a journal as a
sequence of events or its JSON text. Answers are plain dicts in the core's
canonical key order; malformed input raises the core's coded errors
(:class:`~retryledger.JournalError`, :class:`~retryledger.IdempotencyError`, ...).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

from . import _core
from ._api import Document, Policy, _loads, _policy_of, call, check_integer, to_text

__all__ = [
    "Events",
    "journal_verify",
    "journal_recover",
    "journal_append",
    "journal_classify",
    "JournalWriter",
    "idempotency_claim",
    "idempotency_complete",
]

#: A journal: a sequence of event documents, or its JSON text (or UTF-8 bytes).
Events = Union[Sequence[Any], str, bytes]


def _events(events: Events) -> str:
    if isinstance(events, (str, bytes)):
        return to_text(events)
    return to_text(list(events))


def _policy(policy: Union[Policy, Document]) -> Union[_core.Compiled, str]:
    """The policy as the core's journal calls take it: a compiled policy as it
    is (not decoded and validated again for every event), else its text."""
    return policy._compiled if isinstance(policy, Policy) else to_text(policy)


def journal_verify(policy: Union[Policy, Document], events: Events) -> dict[str, Any]:
    """What the replay of a journal against the policy found: ``attempts``,
    ``head_sha256`` (the next event's ``prev_sha256``), ``last_kind``,
    ``lease_generation``, ``next_seq``, ``run_id`` and ``terminal``; or the
    first event the core refuses (``journal_chain_broken``, ``journal_seq_gap``,
    ``journal_stale_lease``, ``journal_plan_drift``, ...)."""
    return _loads(call(_core.journal_verify, _policy(policy), _events(events)))


def journal_recover(
    policy: Union[Policy, Document], events: Events, reconciliation: Optional[Document] = None
) -> dict[str, Any]:
    """What a new owner does with a journal: ``resume`` (append ``next``),
    ``reconcile`` (ask the receiver by idempotency key, not before
    ``not_before_ms``), ``adopt`` (append ``attempt`` as ``observed``) or
    ``done``. While an attempt waits for reconciliation, pass the receiver's
    answers so far (``retryledger.reconciliation.v1``)."""
    rec = None if reconciliation is None else to_text(reconciliation)
    return _loads(call(_core.journal_recover, _policy(policy), _events(events), rec))


def journal_append(
    policy: Union[Policy, Document], events: Events, lease_generation: int, entry: Document
) -> dict[str, Any]:
    """The next event of a journal under the writer's lease generation, built
    from ``entry`` (``{"kind": ...}`` and what only the host knows); append it
    at its ``seq``."""
    generation = check_integer("lease_generation", lease_generation)
    return _loads(
        call(_core.journal_append, _policy(policy), _events(events), generation, to_text(entry))
    )


def journal_classify(policy: Union[Policy, Document], events: Events, event: Document) -> dict[str, Any]:
    """Whether an event offered to a journal appends, repeats one
    (``duplicate``), or is only ``evidence`` (``stale_lease``: a fenced
    owner's; ``seq_taken``). Evidence never changes a decision."""
    return _loads(call(_core.journal_classify, _policy(policy), _events(events), to_text(event)))


class JournalWriter:
    """The writer of one run's journal, for the owner that holds its lease
    (``lease_generation``): the journal as read (``events``) is verified once
    and its replay kept, each :meth:`append` checks the new event alone and
    advances the replay, and :meth:`recover` and :meth:`resume` start from the
    replay rather than from the events. An owner whose store refuses a write
    has lost the run and stops appending through this writer."""

    __slots__ = ("_writer",)

    def __init__(self, policy: Union[Policy, Document], events: Events, lease_generation: int) -> None:
        compiled = _policy_of(policy)
        generation = check_integer("lease_generation", lease_generation)
        self._writer = call(_core.JournalWriter, compiled._compiled, _events(events), generation)

    def append_json(self, entry: Document) -> str:
        """The next event built from ``entry`` (``{"kind": ...}`` and what only
        the host knows), as the canonical JSON a store appends at its ``seq``."""
        return call(self._writer.append, to_text(entry))

    def append(self, entry: Document) -> Dict[str, Any]:
        """:meth:`append_json` as a dict."""
        return _loads(self.append_json(entry))

    def recover(self, reconciliation: Optional[Document] = None) -> Dict[str, Any]:
        """:func:`journal_recover` of the journal written so far."""
        rec = None if reconciliation is None else to_text(reconciliation)
        return _loads(call(self._writer.recover, rec))

    def resume(self, session: _core.Session) -> None:
        """Continue ``session`` (fresh, of the same policy; a price schedule is
        set on it first) from the journal written so far: what
        ``session.resume_journal(events)`` does, without reading the events again."""
        call(self._writer.resume, session)

    @property
    def next_seq(self) -> int:
        """The ``seq`` of the next event."""
        return self._writer.next_seq


def idempotency_claim(
    retention: Document, record: Optional[Document], request: Document, now_epoch_ms: int
) -> dict[str, Any]:
    """A request (``idempotency_key_sha256``, ``request_sha256``) under its
    scoped key at ``now_epoch_ms``, given the record the store holds (or
    ``None``): ``proceed`` (write ``record`` by compare-and-set, then run),
    ``replay`` (the stored result), ``poll`` (after ``retry_after_ms``) or
    ``rejected`` (``key_reuse``, ``key_expired``, ``indeterminate``)."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    rec = None if record is None else to_text(record)
    return _loads(call(_core.idempotency_claim, to_text(retention), rec, to_text(request), now))


def idempotency_complete(
    retention: Document, record: Document, completion: Document, now_epoch_ms: int
) -> dict[str, Any]:
    """The claimed record moved to ``succeeded`` (with ``result_sha256``),
    ``failed_no_effect`` or ``indeterminate``; write it back by compare-and-set."""
    now = check_integer("now_epoch_ms", now_epoch_ms)
    return _loads(
        call(_core.idempotency_complete, to_text(retention), to_text(record), to_text(completion), now)
    )
