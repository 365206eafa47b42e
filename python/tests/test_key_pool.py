"""Key pools through the Python package (docs/FLEET.md, "Key pools"): keys
are named by digests only, taken in turn, a refused key is never taken again,
a limited one not before its hint, and bad arguments are coded errors."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

import pytest

import retryledger
from retryledger import DecodeError, PolicyError

SECRETS = ["sk-pool-a", "sk-pool-b", "sk-pool-c", "sk-pool-d"]
EPOCH = 1_780_000_000_000


def config() -> Dict[str, Any]:
    return {
        "cool_ms": 1_000,
        "keys": [{"key_sha256": retryledger.key_sha256(s)} for s in SECRETS],
        "name": "openai-keys",
        "park_ms": 60_000,
    }


def test_a_key_is_named_by_the_digest_of_its_secret() -> None:
    assert retryledger.key_sha256("sk-pool-a") == hashlib.sha256(b"sk-pool-a").hexdigest()


def test_keys_in_turn_a_refused_key_never_again_a_limited_one_not_before_its_hint() -> None:
    cfg = config()
    digests = [k["key_sha256"] for k in cfg["keys"]]
    snapshot: Optional[Dict[str, Any]] = None
    documents: List[str] = []
    picked: List[str] = []
    now = EPOCH
    for _ in range(4):
        answer = retryledger.key_pool_select(cfg, snapshot, now)
        snapshot = answer["snapshot"]
        picked.append(answer["selection"]["key_sha256"])
        documents.append(json.dumps(answer))
        now += 1
    assert sorted(picked) == sorted(digests), "each key once in four calls, none drained first"

    snapshot = retryledger.key_pool_record(
        cfg, snapshot, digests[1], {"class": "non_retryable", "kind": "rejected"}, now, status=401
    )
    snapshot = retryledger.key_pool_record(
        cfg, snapshot, digests[2], {"class": "retryable", "kind": "rate_limited", "retry_after_ms": 5_000}, now, status=429
    )
    documents.append(json.dumps(snapshot))
    limited_until = now + 5_000
    for step in range(12):
        at = now + step * 1_000
        answer = retryledger.key_pool_select(cfg, snapshot, at)
        snapshot = answer["snapshot"]
        documents.append(json.dumps(answer))
        chosen = answer["selection"]["key_sha256"]
        assert chosen != digests[1], "a refused key is never taken again"
        if at < limited_until:
            assert chosen != digests[2], "a limited key is not taken before its hint"
    assert not any(secret in doc for doc in documents for secret in SECRETS)


def test_bad_arguments_are_coded() -> None:
    cfg = config()
    with pytest.raises(DecodeError) as e:
        retryledger.key_pool_select(cfg, None, "now")  # type: ignore[arg-type]
    assert e.value.code == "invalid_type"
    with pytest.raises(DecodeError) as e:
        retryledger.key_sha256(7)  # type: ignore[arg-type]
    assert e.value.code == "invalid_type"
    with pytest.raises(PolicyError) as err:
        retryledger.key_pool_record(cfg, None, "0" * 64, {"class": "success"}, EPOCH)
    assert err.value.code == "key_not_in_pool"
    with pytest.raises(DecodeError) as e:
        retryledger.key_pool_record(cfg, None, cfg["keys"][0]["key_sha256"], {"class": "success"}, EPOCH, status=-1)
    assert e.value.code == "integer_out_of_range"


def test_a_refused_key_records_its_reason_and_disable_ms_lets_it_back() -> None:
    from retryledger.keypool import KeyRing, pool_config

    ring = KeyRing(SECRETS)
    timed = pool_config("openai-keys", ring, cool_ms=1_000, park_ms=60_000, disable_ms=5_000)
    first = timed["keys"][0]["key_sha256"]
    refused = {"class": "non_retryable", "kind": "policy_denied"}
    held = retryledger.key_pool_record(timed, None, first, refused, EPOCH, status=403)
    assert held["keys"][0]["state"] == "disabled"
    assert held["keys"][0]["reason"] == "forbidden"
    assert held["keys"][0]["until_epoch_ms"] == EPOCH + 5_000
    early = retryledger.key_pool_select(timed, held, EPOCH + 4_999, first)
    assert early["selection"]["key_sha256"] != first, "held until disable_ms has passed"
    back = retryledger.key_pool_select(timed, held, EPOCH + 5_000, first)
    assert back["selection"]["key_sha256"] == first
    assert "reason" not in back["snapshot"]["keys"][0]
    # Without disable_ms: disabled until the configuration changes.
    plain = pool_config("openai-keys", ring, cool_ms=1_000, park_ms=60_000)
    revoked = retryledger.key_pool_record(plain, None, first, {"class": "non_retryable", "kind": "rejected"}, EPOCH, status=401)
    assert revoked["keys"][0]["reason"] == "unauthorized" and "until_epoch_ms" not in revoked["keys"][0]
    assert retryledger.key_pool_select(plain, revoked, EPOCH + 86_400_000, first)["selection"]["key_sha256"] != first
    rotated = pool_config("openai-keys", ring, cool_ms=2_000, park_ms=60_000)
    assert retryledger.key_pool_select(rotated, revoked, EPOCH + 1, first)["selection"]["key_sha256"] == first
    with pytest.raises(PolicyError) as e:
        retryledger.key_pool_select(dict(plain, disable_ms=0), None, EPOCH)
    assert e.value.code == "invalid_key_pool"
