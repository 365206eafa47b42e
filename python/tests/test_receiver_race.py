"""Two separate processes race 1,000 times in a row through PostgreSQL for one
idempotency key, each through the receiver guard's claim path (read the
record, the core's claim, compare-and-set): exactly one proceeds each round,
the other answers 409 in progress, and the key's register was written once.

Each round both children wait for the same instant of the machine's
monotonic clock. The test counts the rounds whose two claims overlapped in
time (most must) and those where both read an empty register and both tried
the compare-and-set (some must: there the store alone decided)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Dict, List

from retryledger.stores import PostgresStore

from fleet_support import HERE, database_url, namespace

CHILD = HERE / "receiver_race_child.py"
ROUNDS = 1000
LEAD_NS = 3_000_000


def test_two_processes_claim_one_idempotency_key_exactly_one_proceeds() -> None:
    url = database_url()
    prefix = f"{namespace()}/idempotency/"
    store = PostgresStore(url)  # the tables exist before the children start
    store.get(f"{prefix}setup")
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), url, prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        for _ in range(2)
    ]

    def read(child: "subprocess.Popen[str]") -> Dict[str, Any]:
        assert child.stdout is not None
        line = child.stdout.readline()
        if not line:
            child.kill()
            raise AssertionError(child.communicate(timeout=10)[1])
        answer: Dict[str, Any] = json.loads(line)
        return answer

    overlaps = contested = 0
    wins = [0, 0]
    try:
        for child in children:
            assert read(child) == {"ready": True}
        for i in range(ROUNDS):
            key = f"order-{i}"
            at = time.monotonic_ns() + LEAD_NS
            for child in children:
                assert child.stdin is not None
                child.stdin.write(f"claim {at} {key} {{\"sku\":\"A-1\",\"round\":{i}}}\n")
                child.stdin.flush()
            answers: List[Dict[str, Any]] = [read(child) for child in children]
            admitted = [a["admitted"] for a in answers]
            assert sorted(admitted) == [False, True], f"round {i}: {answers}"
            winner = admitted.index(True)
            loser = answers[1 - winner]
            assert (loser["status"], loser["code"]) == (409, "idempotency_in_progress"), f"round {i}: {answers}"
            assert answers[winner]["cas"] == [True], f"round {i}: {answers}"
            wins[winner] += 1
            record, generation = store.get(f"{prefix}{_key_sha(key)}")
            assert generation == 1 and record is not None and record["status"] == "in_progress", f"round {i}"
            a, b = answers
            overlaps += a["start"] < b["end"] and b["start"] < a["end"]
            if a["first_read_empty"] and b["first_read_empty"]:
                contested += 1
                assert loser["cas"][:1] == [False], f"round {i}: {answers}"
    finally:
        for child in children:
            if child.stdin is not None:
                child.stdin.close()
        for child in children:
            assert child.stderr is not None
            err = child.stderr.read()
            assert child.wait(timeout=30) == 0, err
    print(f"receiver race: {ROUNDS} rounds, {overlaps} overlapping, {contested} both read empty, wins {wins}")
    assert overlaps > ROUNDS // 2, f"only {overlaps} of {ROUNDS} rounds overlapped: the processes did not race"
    assert contested > 0, "no round had both claims read an empty register"


def _key_sha(key: str) -> str:
    from retryledger import idempotency_key_sha256

    return idempotency_key_sha256(key)
