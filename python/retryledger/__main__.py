"""Command line: ``python -m retryledger verify BUNDLE.json`` and ``python -m retryledger lab``.

``verify`` exits 0 when the bundle replays to its sealed receipt, 1 on drift
and 2 on bad input (unreadable file, malformed document, invalid policy,
usage), printing a one-line reason. It verifies a repair chain
(``retryledger.repair_chain.v1``, docs/REPAIR.md) the same way.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, Optional, Sequence

from ._api import lab, verify_bundle, verify_repair_chain
from ._errors import RetryledgerError

EXIT_VERIFIED = 0
EXIT_DRIFT = 1
EXIT_BAD_INPUT = 2

USAGE = "usage: python -m retryledger verify BUNDLE.json | lab"


def _verify(path: str) -> int:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        print(f"bad input: cannot read {path}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if _is_chain(data):
            return _chain_verdict(verify_repair_chain(data))
        verdict = verify_bundle(data)
    except RetryledgerError as e:
        print(f"bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if verdict["kind"] == "verified":
        print(f"verified: {verdict['terminal']}, receipt sha256 {verdict['receipt_sha256']}")
        return EXIT_VERIFIED
    index = verdict.get("attempt_index")
    attempt = f" (attempt index {index})" if index is not None else ""
    print(f"drift: {verdict['code']} at {verdict['path']}{attempt}: {verdict['message']}")
    return EXIT_DRIFT


def _is_chain(data: bytes) -> bool:
    """Whether the document names itself a repair chain (the core decodes it strictly)."""
    try:
        document = json.loads(data)
    except ValueError:
        return False
    return isinstance(document, dict) and document.get("schema") == "retryledger.repair_chain.v1"


def _chain_verdict(verdict: Dict[str, Any]) -> int:
    if verdict["kind"] == "verified":
        print(
            f"verified: {verdict['terminal']} after {verdict['repairs']} repair{'s' if verdict['repairs'] != 1 else ''}, "
            f"chain sha256 {verdict['chain_sha256']}"
        )
        return EXIT_VERIFIED
    print(f"drift: {verdict['code']} at {verdict['path']} (link index {verdict['link_index']}): {verdict['message']}")
    return EXIT_DRIFT


def _lab() -> int:
    report = lab()
    print(report.case_table.rstrip("\n"))
    print()
    print(report.summary.rstrip("\n"))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "verify":
        return _verify(args[1])
    if args == ["lab"]:
        return _lab()
    print(USAGE, file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
