#!/usr/bin/env python3
"""Recompute every digest in the lab reports from the JSON files alone.

Documents are in normal form (integers only, no nulls), so RFC 8785 canonical
JSON is Python's json.dumps with sorted keys, no whitespace and no ASCII
escaping. Nothing from the Rust code is used here.
"""
import hashlib
import json
import pathlib
import sys


def jcs(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha(value: object) -> str:
    return hashlib.sha256(jcs(value)).hexdigest()


def main(directory: str) -> int:
    reports = sorted(pathlib.Path(directory).glob("*.json"))
    if not reports:
        print(f"no lab report in {directory}", file=sys.stderr)
        return 1
    checked = 0
    for path in reports:
        raw = path.read_bytes()
        report = json.loads(raw)
        base = report["baseline"]
        pairs = [
            ("policy", sha(base["policy"]), report["policy_sha256"]),
            ("attempts", sha(base["attempts"]), report["attempts_sha256"]),
            ("receipt", sha(base["receipt"]), report["receipt_sha256"]),
            ("receipt.policy_sha256", base["receipt"]["policy_sha256"], report["policy_sha256"]),
            ("receipt.attempts_sha256", base["receipt"]["attempts_sha256"], report["attempts_sha256"]),
            ("file is canonical", jcs(report).decode("utf-8"), raw.decode("utf-8")),
            ("file name", sha(base["policy"]) + ".json", path.name),
        ]
        for name, got, want in pairs:
            if got != want:
                print(f"{path.name}: {name} differs", file=sys.stderr)
                return 1
            checked += 1
        print(f"{path.name}: report SHA-256 {hashlib.sha256(raw).hexdigest()} ({len(raw):,} bytes)")
    print(f"{checked} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "target/labs/retry-fallback"))
