"""retryledger: decide every retry and fallback of one logical request, and seal the run.

One no-I/O Rust core validates the policy before the first dispatch, says what
to dispatch next and not before when, judges what each attempt did, stops on
the first exceeded bound and hashes the result; this package is its Python
binding and the drivers that do the I/O (clock, sleep, dispatch).

    policy = retryledger.Policy(policy_dict)      # every rule checked once
    result = retryledger.run(policy, dispatch, idempotency_key)
    result.value, result.receipt, result.bundle   # sealed in SHA-256 receipts

A streamed request: ``for event in retryledger.run_stream(policy, dispatch,
key)`` yields the consumer's events (tentative deltas, one commit, an
invalidate for a failed attempt's output) under the policy's stream contract.

Fleet protection (docs/FLEET.md): for a policy with a ``fleet`` section, pass
``fleet=retryledger.Fleet(store)`` (a store of :mod:`retryledger.stores`:
memory, SQLite, Redis, PostgreSQL) to any driver; each attempt is admitted against the
shared circuit breakers and retry budget before it is dispatched.

A host of its own drives the core's state machine directly:
``session = policy.session()``, then ``session.next()`` (a :class:`Dispatch`
or :class:`Terminal`), ``session.observe(..., facts=Facts(...))`` (a
:class:`Judgement`) and ``session.seal()``.
"""

from __future__ import annotations

from ._api import (
    Document,
    LabReport,
    Policy,
    breaker_admit,
    breaker_record,
    budget_deposit,
    budget_withdraw,
    admission_admit,
    admission_release,
    admission_observe,
    key_pool_select,
    key_pool_record,
    key_sha256,
    classify_http,
    digest,
    evaluate,
    judge,
    next_repair,
    verify_repair_chain,
    request_sha256,
    build_policy,
    lift_request,
    check_price_schedule,
    price_cost,
    canonical_request,
    idempotency_key_sha256,
    lab,
    parse_retry_after,
    plan_next,
    validate_policy,
    verify_bundle,
    PolicyTemplate,
    compile_policy_template,
)
from ._core import Dispatch, Facts, Judgement, Outcome, Sealed, Session, Terminal
from ._decorator import Retrying, retry
from ._driver import (
    AttemptCallback,
    AttemptError,
    Classifier,
    DecisionCallback,
    RunCancelledError,
    RunResult,
    RunStoppedError,
    SleepCallback,
    Step,
    TerminalCallback,
    UnrecognizedDispatchError,
    facts_of,
    run,
    run_async,
)
from ._stream import (
    AsyncStreamRun,
    StreamEvent,
    StreamProtocolError,
    StreamReader,
    StreamRun,
    StreamStep,
    StreamTimeoutError,
    TextReader,
    run_stream,
    run_stream_async,
)
from .fleet import Fleet, request_token_bound
from .hedge import HedgeSession, run_hedged_async
from . import journal
from .machine import machine_transcript
from .journal import (
    JournalWriter,
    idempotency_claim,
    idempotency_complete,
    journal_append,
    journal_classify,
    journal_recover,
    journal_verify,
)
from ._errors import (
    DecodeError,
    DriftError,
    HookWarning,
    HttpError,
    IdempotencyError,
    JournalError,
    PolicyError,
    ReceiptError,
    RetryledgerError,
    RetryledgerWarning,
    RouteClientMissingError,
    RunError,
)
from .lowering import (
    Lowered,
    LoweredRoute,
    LoweringNote,
    RouteCapabilities,
    RouteCapability,
    lower_request,
    lower_routes,
    route_capabilities,
)

__all__ = [
    "retry",
    "Retrying",
    "AttemptCallback",
    "AttemptError",
    "Classifier",
    "DecisionCallback",
    "SleepCallback",
    "TerminalCallback",
    "DecodeError",
    "Dispatch",
    "Document",
    "DriftError",
    "Facts",
    "Fleet",
    "request_token_bound",
    "HookWarning",
    "HttpError",
    "IdempotencyError",
    "JournalError",
    "Judgement",
    "LabReport",
    "Outcome",
    "Policy",
    "PolicyError",
    "ReceiptError",
    "RetryledgerError",
    "RetryledgerWarning",
    "RouteClientMissingError",
    "RunCancelledError",
    "RunError",
    "RunResult",
    "RunStoppedError",
    "Sealed",
    "Session",
    "HedgeSession",
    "run_hedged_async",
    "Step",
    "Terminal",
    "UnrecognizedDispatchError",
    "breaker_admit",
    "breaker_record",
    "budget_deposit",
    "budget_withdraw",
    "admission_admit",
    "admission_release",
    "admission_observe",
    "key_pool_select",
    "key_pool_record",
    "key_sha256",
    "classify_http",
    "digest",
    "evaluate",
    "facts_of",
    "judge",
    "next_repair",
    "verify_repair_chain",
    "journal",
    "machine_transcript",
    "JournalWriter",
    "journal_append",
    "journal_classify",
    "journal_recover",
    "journal_verify",
    "idempotency_claim",
    "idempotency_complete",
    "request_sha256",
    "build_policy",
    "lift_request",
    "check_price_schedule",
    "price_cost",
    "canonical_request",
    "idempotency_key_sha256",
    "lab",
    "parse_retry_after",
    "plan_next",
    "run",
    "run_async",
    "run_stream",
    "run_stream_async",
    "AsyncStreamRun",
    "StreamEvent",
    "StreamProtocolError",
    "StreamReader",
    "StreamRun",
    "StreamStep",
    "StreamTimeoutError",
    "TextReader",
    "validate_policy",
    "verify_bundle",
    "PolicyTemplate",
    "compile_policy_template",
    "Lowered",
    "LoweredRoute",
    "LoweringNote",
    "RouteCapabilities",
    "RouteCapability",
    "lower_request",
    "lower_routes",
    "route_capabilities",
]
