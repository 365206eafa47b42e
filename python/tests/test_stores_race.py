"""Two separate processes race through one store, 1,000 times in a row:

* to create the same register key with compare-and-set from generation 0
  (the write that claims an idempotency key): exactly one proceeds, the
  other is refused with generation 1, and the key holds the winner's
  document;
* to append the same seq of one log: exactly one is appended, the other
  answers ``seq_taken`` with the winner's event.

Each round both children wait for the same instant of the machine's
monotonic clock, then write; the rounds whose two writes overlapped in time
are counted, and some must have (else the test would not be racing)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from fleet_support import HERE, make_store, namespace, store_target

CHILD = HERE / "store_race_child.py"
ROUNDS = 1000
# How far ahead of now each round starts: both children have read their command by then.
LEAD_NS = 3_000_000


class Racers:
    def __init__(self, backend: str, target: str) -> None:
        self.children = [
            subprocess.Popen(
                [sys.executable, str(CHILD), backend, target],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            for _ in range(2)
        ]
        for child in self.children:
            assert child.stdout is not None
            ready = child.stdout.readline()
            assert json.loads(ready or "null") == {"ready": True}, self._stderr(child)

    def _stderr(self, child: "subprocess.Popen[str]") -> str:
        child.kill()
        _, err = child.communicate(timeout=10)
        return err

    def race(self, commands: Tuple[str, str]) -> List[Dict[str, Any]]:
        at = time.monotonic_ns() + LEAD_NS
        for child, command in zip(self.children, commands):
            assert child.stdin is not None
            child.stdin.write(command.replace("@", str(at), 1) + "\n")
            child.stdin.flush()
        answers = []
        for child in self.children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line:
                raise AssertionError(self._stderr(child))
            answers.append(json.loads(line))
        return answers

    def close(self) -> None:
        for child in self.children:
            if child.stdin is not None:
                child.stdin.close()
        for child in self.children:
            assert child.stderr is not None
            err = child.stderr.read()
            assert child.wait(timeout=30) == 0, err


def overlapped(answers: List[Dict[str, Any]]) -> bool:
    a, b = answers
    return bool(a["start"] < b["end"] and b["start"] < a["end"])


@pytest.mark.parametrize("backend", ["postgres"])
def test_two_processes_claim_one_key_exactly_one_proceeds(backend: str, tmp_path: Path) -> None:
    store = make_store(backend, tmp_path)  # the tables exist before the children start
    racers = Racers(backend, store_target(backend, tmp_path))
    ns = namespace()
    overlaps = 0
    wins = [0, 0]
    try:
        for i in range(ROUNDS):
            key = f"{ns}/idempotency/{i}"
            answers = racers.race((f"cas @ {key} " + '{"owner":0}', f"cas @ {key} " + '{"owner":1}'))
            oks = [a["ok"] for a in answers]
            assert sorted(oks) == [False, True], f"round {i}: {answers}"
            assert [a["generation"] for a in answers] == [1, 1], f"round {i}: {answers}"
            winner = oks.index(True)
            wins[winner] += 1
            assert store.get(key) == ({"owner": winner}, 1), f"round {i}"
            overlaps += overlapped(answers)
    finally:
        racers.close()
    print(f"{backend}: {ROUNDS} rounds, {overlaps} with overlapping writes, wins {wins}")
    assert overlaps > 0, "the two writes never overlapped: the processes did not race"


@pytest.mark.parametrize("backend", ["postgres"])
def test_two_processes_append_one_seq_exactly_one_is_appended(backend: str, tmp_path: Path) -> None:
    store = make_store(backend, tmp_path)
    racers = Racers(backend, store_target(backend, tmp_path))
    log = f"{namespace()}/journal"
    overlaps = 0
    try:
        for seq in range(ROUNDS):
            events = ('{"seq":%d,"worker":0}' % seq, '{"seq":%d,"worker":1}' % seq)
            answers = racers.race((f"append @ {log} {seq} {events[0]}", f"append @ {log} {seq} {events[1]}"))
            oks = [a["ok"] for a in answers]
            assert sorted(oks) == [False, True], f"seq {seq}: {answers}"
            winner = oks.index(True)
            loser = answers[1 - winner]
            assert (loser["code"], loser["existing"]) == ("seq_taken", events[winner]), f"seq {seq}: {answers}"
            assert answers[winner]["code"] == "appended"
            overlaps += overlapped(answers)
    finally:
        racers.close()
    entries = store.read(log)
    assert [e.seq for e in entries] == list(range(ROUNDS))
    assert store.last_seq(log) == ROUNDS - 1
    print(f"{backend}: {ROUNDS} appends raced, {overlaps} with overlapping writes")
    assert overlaps > 0, "the two appends never overlapped: the processes did not race"
