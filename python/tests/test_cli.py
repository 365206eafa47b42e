"""``python -m retryledger verify`` and ``lab``, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

import retryledger

from conftest import reference_bundle


def cli(*args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, "-m", "retryledger", *args], capture_output=True, text=True, timeout=60
    )


def test_verify_exit_codes(tmp_path: Path) -> None:
    bundle = reference_bundle()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(bundle))
    result = cli("verify", str(good))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("verified: completed")
    assert len(result.stdout.strip().splitlines()) == 1

    bundle["attempts"]["attempts"][1]["started_at_ms"] = 1_300
    drifted = tmp_path / "drift.json"
    drifted.write_text(json.dumps(bundle))
    result = cli("verify", str(drifted))
    assert result.returncode == 1
    assert result.stdout.startswith("drift: early_start at /attempts/attempts/1/started_at_ms")
    assert len(result.stdout.strip().splitlines()) == 1

    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    result = cli("verify", str(garbage))
    assert result.returncode == 2
    assert result.stderr.startswith("bad input: invalid_json")

    result = cli("verify", str(tmp_path / "missing.json"))
    assert result.returncode == 2
    assert "cannot read" in result.stderr


@pytest.mark.parametrize("args", [[], ["verify"], ["nonsense"]])
def test_usage_is_bad_input(args: List[str]) -> None:
    result = cli(*args)
    assert result.returncode == 2
    assert "usage" in result.stderr


def test_verify_reads_what_a_run_writes(tmp_path: Path) -> None:
    from conftest import KEY, FakeClock, make_policy

    clock = FakeClock()
    result = retryledger.run(make_policy(), lambda step: "ok", KEY, clock=clock, sleep=clock.sleep)
    path = tmp_path / "run.json"
    path.write_text(result.bundle_json)
    out = cli("verify", str(path))
    assert out.returncode == 0
    assert result.receipt_sha256 in out.stdout


def test_lab_prints_the_case_table_and_summary() -> None:
    result = cli("lab")
    assert result.returncode == 0
    lab = retryledger.lab()
    assert lab.case_table.strip() in result.stdout
    assert lab.summary.strip() in result.stdout


def test_verify_reads_a_repair_chain(tmp_path: Path) -> None:
    vectors = json.loads((Path(__file__).resolve().parents[2] / "tests/vectors/repair.json").read_text())["cases"]
    chain = next(c for c in vectors if c["name"] == "chain_one_repair_completes")["input"]["chain"]
    good = tmp_path / "chain.json"
    good.write_text(chain)
    r = cli("verify", str(good))
    assert r.returncode == 0 and r.stdout.startswith("verified: completed after 1 repair, chain sha256 ")
    bad = tmp_path / "same.json"
    bad.write_text(next(c for c in vectors if c["name"] == "chain_repair_same_request")["input"]["chain"])
    r = cli("verify", str(bad))
    assert r.returncode == 1 and r.stdout.startswith("drift: repair_same_request at /links/1")
