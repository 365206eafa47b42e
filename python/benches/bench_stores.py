"""What a store write costs, next to a bare ``INSERT`` + ``COMMIT`` on the
same database.

For SQLite (WAL, ``synchronous=NORMAL`` and ``synchronous=FULL``, a file
under ``target/``) and PostgreSQL (``DATABASE_URL``, e.g. under
``tests/servers/with-postgres.sh``: fsync on), the wall time per operation
of:

* a register compare-and-set that claims a new key (generation 0: the
  write of an idempotency claim);
* a register compare-and-set of the next generation of one key;
* a log append of the next ``seq`` (an event of about 300 bytes, as a
  journal's);
* a bare ``INSERT`` of a row of the same size into a table of its own, in
  its own transaction (autocommit), through the same driver and settings:
  the floor any durable write pays.

Each figure is the median of R rounds of N operations, the four
interleaved in a rotating order within each round; the ratio is to the bare
insert on the same database. Without ``DATABASE_URL`` PostgreSQL is skipped
and says so.

    python python/benches/bench_stores.py [--ops N] [--rounds R] [--write docs/BENCHMARKS.md]

``--write`` replaces the text between ``<!-- python-stores:begin -->`` and
``<!-- python-stores:end -->`` when the file has those markers, and otherwise
leaves the file alone (the figures are printed either way).
"""

from __future__ import annotations

import argparse
import json
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

from retryledger.stores import PostgresStore, SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
BODY = "x" * 240


def event(seq: int) -> str:
    """A journal-like event of about 300 bytes."""
    return json.dumps(
        {"kind": "dispatched", "lease_generation": 1, "prev_sha256": "0" * 64, "seq": seq, "pad": BODY[:140]},
        separators=(",", ":"),
    )


Op = Callable[[int], None]


def contenders(store: Any, bare: Op) -> List[Tuple[str, Op]]:
    run = uuid.uuid4().hex
    state = {"generation": 0}

    def claim(i: int) -> None:
        ok, _ = store.compare_and_set_raw(f"{run}/claim/{i}", 0, BODY)
        assert ok

    def next_generation(i: int) -> None:
        ok, generation = store.compare_and_set_raw(f"{run}/register", state["generation"], BODY)
        assert ok
        state["generation"] = generation

    seqs = {"next": 0}

    def append(i: int) -> None:
        seq = seqs["next"]
        assert store.append(f"{run}/journal", seq, event(seq)).ok
        seqs["next"] = seq + 1

    return [
        ("bare", bare),
        ("claim", claim),
        ("cas", next_generation),
        ("append", append),
    ]


def measure(ops: List[Tuple[str, Op]], n: int, rounds: int) -> Dict[str, float]:
    """Median µs per operation of each contender."""
    counter = {name: 0 for name, _ in ops}
    for name, op in ops:  # warm up (prepared statements, first pages)
        for _ in range(5):
            op(counter[name])
            counter[name] += 1
    walls: Dict[str, List[float]] = {name: [] for name, _ in ops}
    for r in range(rounds):
        order = ops[r % len(ops):] + ops[: r % len(ops)]
        for name, op in order:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                op(counter[name])
                counter[name] += 1
            walls[name].append((time.perf_counter_ns() - t0) / n / 1000)
    return {name: statistics.median(v) for name, v in walls.items()}


def sqlite_part(directory: Path, synchronous: str, n: int, rounds: int) -> Dict[str, float]:
    path = directory / f"stores-{synchronous.lower()}.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    store = SQLiteStore(path, synchronous=synchronous)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("CREATE TABLE bench_bare (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")

    def bare(i: int) -> None:
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
    conn.execute("CREATE TABLE IF NOT EXISTS retryledger_bench_bare (id bigserial PRIMARY KEY, body text NOT NULL)")

    def bare(i: int) -> None:
        conn.execute("INSERT INTO retryledger_bench_bare (body) VALUES (%s)", (BODY,))

    try:
        return measure(contenders(store, bare), n, rounds)
    finally:
        conn.execute("DROP TABLE retryledger_bench_bare")
        conn.close()
        store.close()


ROWS = (
    ("claim", "register compare-and-set, a new key (generation 0: a claim)"),
    ("cas", "register compare-and-set, the next generation of one key"),
    ("append", "log append, the next `seq` (a ~300-byte event)"),
    ("bare", "bare `INSERT` + `COMMIT` (autocommit, same row size)"),
)


def table(results: List[Tuple[str, Dict[str, float]]]) -> List[str]:
    head = "| per operation (wall) | " + " | ".join(name for name, _ in results) + " |"
    rule = "| --- |" + " ---: |" * len(results)
    lines = [head, rule]
    for key, label in ROWS:
        cells = []
        for _, figures in results:
            us = figures[key]
            ratio = us / figures["bare"]
            cells.append(f"{us:,.1f} µs" if key == "bare" else f"{us:,.1f} µs (**{ratio:.2f}×**)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=200, help="operations per contender per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; figures are medians")
    parser.add_argument("--write", type=Path, help="update the python-stores section of this markdown file")
    args = parser.parse_args(argv)
    directory = ROOT / "target" / "bench-stores"
    directory.mkdir(parents=True, exist_ok=True)
    results: List[Tuple[str, Dict[str, float]]] = [
        ("SQLite WAL, `synchronous=NORMAL`", sqlite_part(directory, "NORMAL", args.ops * 5, args.rounds)),
        ("SQLite WAL, `synchronous=FULL`", sqlite_part(directory, "FULL", args.ops, args.rounds)),
    ]
    url = os.environ.get("DATABASE_URL")
    if url:
        import psycopg

        results.append((f"PostgreSQL {server_version(url)}", postgres_part(url, args.ops, args.rounds)))
        client = f"psycopg {psycopg.__version__}"
    else:
        client = "PostgreSQL: not measured (no `DATABASE_URL`; run under `tests/servers/with-postgres.sh`)"
    shutil.rmtree(directory, ignore_errors=True)
    lines = [
        f"CPython {platform.python_version()}, sqlite3 {sqlite3.sqlite_version}, {client}; "
        f"`python/benches/bench_stores.py`, median of {args.rounds} interleaved rounds of {args.ops:,} operations "
        f"({args.ops * 5:,} for `synchronous=NORMAL`); SQLite on a file under `target/`, PostgreSQL on loopback "
        "(a throwaway cluster, fsync on). The ratio is to the bare insert on the same database.",
        "",
        *table(results),
        "",
        "Each store write is one transaction, as the bare insert is: the compare-and-set is one `BEGIN IMMEDIATE` "
        "transaction on SQLite and one statement on PostgreSQL, the append one `INSERT` refused by the primary key "
        "`(log, seq)` when the number is taken. With `synchronous=FULL` and on PostgreSQL every commit waits for "
        "the disk, so that wait is most of every figure; `synchronous=NORMAL` syncs at checkpoints only (a commit "
        "survives a process that dies, not a machine that does).",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write is not None:
        doc = args.write.read_text()
        pattern = re.compile(r"(<!-- python-stores:begin -->\n).*?(\n<!-- python-stores:end -->)", re.S)
        if not pattern.search(doc):
            print(f"no python-stores markers in {args.write}: not written", file=sys.stderr)
            return 0
        args.write.write_text(pattern.sub(lambda m: m.group(1) + text + m.group(2), doc, count=1))
        print(f"wrote {args.write} between <!-- python-stores:begin --> and <!-- python-stores:end -->")
    return 0


def server_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]).split(" ")[0] if row else "?"


if __name__ == "__main__":
    sys.exit(main())
