"""What a journal costs per attempt, next to a bare ``INSERT`` + ``COMMIT`` on
the same database.

The reference run (the primary rate limited, then unavailable, the fallback
serves: three attempts) with ``retryledger.journaled.run_journaled`` against
an in-memory store, SQLite (WAL, ``synchronous=NORMAL`` and ``FULL``, a file
under ``target/``) and PostgreSQL (``DATABASE_URL``, e.g. under
``tests/servers/with-postgres.sh``: fsync on), with a dispatch that answers at
once and a clock that does not sleep, so that the figure is the journal's own
cost: per run one lease claim and 15 events (``created``, ``decided``, four
per attempt, ``terminal``), each a fenced append (the lease checked in the
same transaction), built and checked by the core. Next to it: the same run with the plain driver
(no journal), and a bare ``INSERT`` of a ~300-byte row in its own
transaction through the same driver and settings.

Each figure is the median of R rounds of N runs (N inserts), the contenders
interleaved in a rotating order within each round.

    python python/benches/bench_journal.py [--runs N] [--rounds R] [--write docs/BENCHMARKS.md]

``--write`` replaces the text between ``<!-- python-journal:begin -->`` and
``<!-- python-journal:end -->`` when the file has those markers.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import sqlite3
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import retryledger
from retryledger.journaled import JournalStep, run_journaled
from retryledger.stores import MemoryStore, PostgresStore, SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))

from conftest import KEY, make_policy  # noqa: E402

BODY = "x" * 300
ATTEMPTS = 3
POLICY = retryledger.Policy(make_policy())


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, ms: float) -> None:
        self.now += ms


def dispatch(step: Any) -> str:
    if step.ordinal == 3:
        step.charge(step.reserve_cost)
        return "ok"
    step.charge(0)
    if step.ordinal == 1:
        raise retryledger.AttemptError.retryable("rate_limited", retry_after_ms=250)
    raise retryledger.AttemptError.retryable("unavailable")


Op = Callable[[], None]


def contenders(store: Any, bare: Optional[Op]) -> List[Tuple[str, Op, int]]:
    """(name, operation, attempts per operation): per-attempt figures divide by the last."""
    tag = uuid.uuid4().hex[:12]
    count = {"n": 0}

    def journaled() -> None:
        count["n"] += 1
        clock = Clock(1_780_000_000_000.0)
        r = run_journaled(POLICY, dispatch, KEY, store=store, run_id=f"bench-{tag}-{count['n']}", clock=clock, sleep=clock.sleep)
        assert r.terminal == "completed"

    def plain() -> None:
        clock = Clock(0.0)
        r = retryledger.run(POLICY, dispatch, KEY, clock=clock, sleep=clock.sleep)
        assert r.terminal == "completed"

    ops: List[Tuple[str, Op, int]] = [("journaled", journaled, ATTEMPTS), ("plain", plain, ATTEMPTS)]
    if bare is not None:
        ops.append(("bare", bare, 1))
    return ops


def measure(ops: List[Tuple[str, Op, int]], n: int, rounds: int) -> Dict[str, float]:
    """Median µs per attempt (per insert for the bare one)."""
    for _, op, _ in ops:
        for _ in range(3):
            op()
    walls: Dict[str, List[float]] = {name: [] for name, _, _ in ops}
    for r in range(rounds):
        order = ops[r % len(ops):] + ops[: r % len(ops)]
        for name, op, per in order:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                op()
            walls[name].append((time.perf_counter_ns() - t0) / n / per / 1000)
    return {name: statistics.median(v) for name, v in walls.items()}


def sqlite_part(directory: Path, synchronous: str, n: int, rounds: int) -> Dict[str, float]:
    path = directory / f"journal-{synchronous.lower()}.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    store = SQLiteStore(path, synchronous=synchronous)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("CREATE TABLE bench_bare (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")

    def bare() -> None:
        conn.execute("INSERT INTO bench_bare (body) VALUES (?)", (BODY,))

    try:
        return measure(contenders(store, bare), n, rounds)
    finally:
        conn.close()
        store.close()


def postgres_part(url: str, n: int, rounds: int) -> Dict[str, float]:
    import psycopg

    store = PostgresStore(url)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS retryledger_bench_journal_bare (id bigserial PRIMARY KEY, body text NOT NULL)")

    def bare() -> None:
        conn.execute("INSERT INTO retryledger_bench_journal_bare (body) VALUES (%s)", (BODY,))

    try:
        return measure(contenders(store, bare), n, rounds)
    finally:
        conn.execute("DROP TABLE retryledger_bench_journal_bare")
        conn.close()
        store.close()


def fmt(us: float) -> str:
    return f"{us:,.1f} µs"


def table(results: List[Tuple[str, Dict[str, float]]]) -> List[str]:
    lines = [
        "| per attempt (wall) | " + " | ".join(name for name, _ in results) + " |",
        "| --- |" + " ---: |" * len(results),
    ]

    def row(label: str, cells: List[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("journaled run (`run_journaled`)", [fmt(f["journaled"]) for _, f in results])
    row("plain run (`run`, no journal)", [fmt(f["plain"]) for _, f in results])
    row(
        "**the journal's cost** (the difference)",
        [
            f"**{fmt(f['journaled'] - f['plain'])}**"
            + (f" (**{(f['journaled'] - f['plain']) / f['bare']:.1f}×** a bare insert)" if "bare" in f else "")
            for _, f in results
        ],
    )
    row("bare `INSERT` + `COMMIT` (one ~300-byte row, per insert)", [fmt(f["bare"]) if "bare" in f else "–" for _, f in results])
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="runs per contender per round (5x for memory and NORMAL)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; figures are medians")
    parser.add_argument("--write", type=Path, help="update the python-journal section of this markdown file")
    args = parser.parse_args(argv)
    directory = ROOT / "target" / "bench-journal"
    directory.mkdir(parents=True, exist_ok=True)
    results: List[Tuple[str, Dict[str, float]]] = [
        ("in memory (`MemoryStore`)", measure(contenders(MemoryStore(), None), args.runs * 5, args.rounds)),
        ("SQLite WAL, `synchronous=NORMAL`", sqlite_part(directory, "NORMAL", args.runs * 5, args.rounds)),
        ("SQLite WAL, `synchronous=FULL`", sqlite_part(directory, "FULL", args.runs, args.rounds)),
    ]
    url = os.environ.get("DATABASE_URL")
    if url:
        import psycopg

        with psycopg.connect(url) as c:
            row = c.execute("SHOW server_version").fetchone()
        version = str(row[0]).split(" ")[0] if row else "?"
        results.append((f"PostgreSQL {version}", postgres_part(url, args.runs, args.rounds)))
        client = f"psycopg {psycopg.__version__}"
    else:
        client = "PostgreSQL: not measured (no `DATABASE_URL`; run under `tests/servers/with-postgres.sh`)"
    shutil.rmtree(directory, ignore_errors=True)
    text = "\n".join(
        [
            f"CPython {platform.python_version()}, sqlite3 {sqlite3.sqlite_version}, {client}; "
            f"`python/benches/bench_journal.py`, the reference run ({ATTEMPTS} attempts), median of {args.rounds} "
            f"interleaved rounds of {args.runs:,} runs ({args.runs * 5:,} in memory and for `synchronous=NORMAL`); "
            "SQLite on a file under `target/`, PostgreSQL on loopback (a throwaway cluster, fsync on).",
            "",
            *table(results),
            "",
            "A journaled attempt writes four events (`reserved`, `dispatched`, `observed`, `decided`), each one "
            "transaction that also checks the lease register (a fenced append); a run adds the lease claim, `created`, the first "
            "`decided` and `terminal`: 16 commits for three attempts, about 5.3 per attempt. The rest is the core's "
            "share, the in-memory column: the owner's `JournalWriter` checks each event against the replay it "
            "keeps (not against the journal replayed again), and the session of each attempt continues from that "
            "replay. Which of the two dominates depends on how long a commit waits for the disk.",
        ]
    )
    print(text)
    if args.write is not None:
        doc = args.write.read_text()
        pattern = re.compile(r"(<!-- python-journal:begin -->\n).*?(\n<!-- python-journal:end -->)", re.S)
        if not pattern.search(doc):
            print(f"no python-journal markers in {args.write}: not written", file=sys.stderr)
            return 0
        args.write.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc, count=1))
        print(f"wrote {args.write} between <!-- python-journal:begin --> and <!-- python-journal:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
