"""A child process of the store race tests: one store client, driven line by
line on stdin, one answer line of JSON on stdout per command.

    store_race_child.py <sqlite|redis|postgres> <target>

Commands (the time is ``time.monotonic_ns()``, the same clock in every process
of the machine; the child waits for it, so both racers start together):

    cas <at_ns> <key> <document JSON>     compare_and_set(key, 0, document)
    append <at_ns> <log> <seq> <event>    append(log, seq, event)

Answer: {"ok": ..., "generation" | "code", "existing", "start": ns, "end": ns}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Dict

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_child import open_store  # noqa: E402
from retryledger.stores import Log  # noqa: E402


def main() -> None:
    store: Any = open_store(sys.argv[1], sys.argv[2])
    log: Log = store
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command, at, rest = line.rstrip("\n").split(" ", 2)
        target = int(at)
        while time.monotonic_ns() < target:
            pass
        answer: Dict[str, Any]
        if command == "cas":
            key, document = rest.split(" ", 1)
            start = time.monotonic_ns()
            ok, generation = store.compare_and_set(key, 0, json.loads(document))
            end = time.monotonic_ns()
            answer = {"ok": ok, "generation": generation}
        elif command == "append":
            name, seq, event = rest.split(" ", 2)
            start = time.monotonic_ns()
            appended = log.append(name, int(seq), event)
            end = time.monotonic_ns()
            answer = {"ok": appended.ok, "code": appended.code, "existing": appended.existing}
        else:
            raise SystemExit(f"unknown command {command}")
        answer.update(start=start, end=end)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
