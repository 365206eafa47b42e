"""Shared helpers: a policy like the lab's reference with a known raw idempotency key,
and a fake clock whose sleep advances it."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any, Dict, List

import retryledger
from retryledger.testing import FakeClock as _FakeClock

ROOT = Path(__file__).resolve().parents[2]
KEY = "idempotency-key: tenant-7/op-summarize/INC-4471"

_REFERENCE = retryledger.lab().report


def reference_bundle() -> Dict[str, Any]:
    """The lab's reference bundle (policy, attempts, receipt)."""
    bundle: Dict[str, Any] = copy.deepcopy(_REFERENCE["baseline"])
    return bundle


def make_policy(**overrides: Any) -> Dict[str, Any]:
    """The reference policy (two routes, two attempts each) with top-level overrides."""
    policy: Dict[str, Any] = reference_bundle()["policy"]
    assert policy["idempotency_key_sha256"] == hashlib.sha256(KEY.encode()).hexdigest()
    policy.update(overrides)
    return policy


# The package's own fake clock (retryledger.testing): the suites test what users get.
FakeClock = _FakeClock
