"""retryledger: decide every retry and fallback of one logical request, and seal the run.

One no-I/O Rust core validates the policy before the first dispatch, says what
to dispatch next and not before when, judges each outcome, stops on the first
exceeded bound and hashes the result; this package is its Python binding and
the drivers that do the I/O (clock, sleep, dispatch).

    policy = retryledger.Policy(policy_dict)      # every rule checked once
    result = retryledger.run(policy, dispatch, idempotency_key)
    result.value, result.receipt, result.bundle   # sealed in SHA-256 receipts
"""

from __future__ import annotations

from ._api import (
    Document,
    LabReport,
    Policy,
    classify_http,
    digest,
    evaluate,
    lab,
    parse_retry_after,
    plan_next,
    validate_policy,
    verify_bundle,
)
from ._driver import (
    AttemptError,
    Classifier,
    RunCancelledError,
    RunStoppedError,
    RunResult,
    Step,
    UnrecognizedDispatchError,
    http_outcome,
    run,
    run_async,
)
from ._errors import (
    DecodeError,
    DriftError,
    HttpError,
    PolicyError,
    ReceiptError,
    RetryledgerError,
    RunError,
)

__all__ = [
    "AttemptError",
    "Classifier",
    "DecodeError",
    "Document",
    "DriftError",
    "HttpError",
    "LabReport",
    "Policy",
    "PolicyError",
    "ReceiptError",
    "RetryledgerError",
    "RunCancelledError",
    "RunError",
    "RunStoppedError",
    "RunResult",
    "Step",
    "UnrecognizedDispatchError",
    "classify_http",
    "digest",
    "evaluate",
    "http_outcome",
    "lab",
    "parse_retry_after",
    "plan_next",
    "run",
    "run_async",
    "validate_policy",
    "verify_bundle",
]
