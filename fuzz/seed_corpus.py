"""Seed each fuzz target's corpus with the inputs of the conformance vectors.

Usage: python3 fuzz/seed_corpus.py  (from the repository root; writes fuzz/corpus/<target>/)
"""
import hashlib
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def put(target, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


for path in sorted((ROOT / "tests" / "vectors").glob("*.json")):
    for case in json.loads(path.read_text(encoding="utf-8")).get("cases", []):
        op, inp = case["op"], case["input"]
        enc = lambda s: s.encode("utf-8", "surrogatepass")
        if op == "validate_policy":
            put("decode_policy", enc(inp["policy"]))
            put("digest", enc(inp["policy"]))
        elif op in ("plan_next", "evaluate"):
            both = enc(inp["policy"]) + b"\0" + enc(inp["attempts"])
            put("plan_next", both)
            put("evaluate", both)
            put("decode_attempts", enc(inp["attempts"]))
        elif op == "verify_bundle":
            put("verify_bundle", enc(inp["bundle"]))
            put("decode_bundle", enc(inp["bundle"]))
        elif op == "digest":
            put("digest", enc(inp["document"]))
        elif op == "judge":
            put("judge", enc(inp["facts"]))
            facts = json.loads(inp["facts"])
            if isinstance(facts, dict) and isinstance(facts.get("error_body"), str):
                families = ["generic", "openai", "azure_openai", "anthropic", "google"]
                family = families.index(facts["provider_family"]) if facts.get("provider_family") in families else 0
                status = facts.get("status", 429) if isinstance(facts.get("status"), int) else 429
                head = "".join("%s: %s\n" % (n, v) for n, v in facts.get("headers", []))
                put(
                    "provider_body",
                    bytes([family]) + struct.pack("<H", (status - 100) % 500) + struct.pack("<I", 60_000)
                    + enc(facts["error_body"]) + b"\0" + enc(head),
                )
        elif op == "verify_repair_chain":
            put("repair_chain", enc(inp["chain"]))
        elif op in ("canonical_request", "request_sha256"):
            put("request", enc(inp["request"]))
        elif op == "build_policy":
            put("build_policy", enc(inp["request"]) + b"\0" + enc(inp["spec"]))
        elif op == "price_cost":
            put("price_cost", enc(inp["schedule"]) + b"\0" + enc(inp["route_release_sha256"]) + b"\0" + enc(inp["usage"]))
        elif op in ("journal_verify", "journal_recover", "journal_append", "journal_classify"):
            data = enc(inp["events"])
            if "reconciliation" in inp or "event" in inp:
                data += b"\0" + enc(inp.get("reconciliation", ""))
            if "event" in inp:
                data += b"\0" + enc(inp["event"])
            put("journal", data)
        elif op in ("idempotency_claim", "idempotency_complete"):
            now = struct.pack("<Q", inp["now_epoch_ms"])
            put("idempotency", now + enc(inp["retention"]) + b"\0" + enc(inp.get("record", "")) + b"\0"
                + enc(inp.get("request", "{}")) + b"\0" + enc(inp.get("completion", "{}")))
        elif op == "admission_observe":
            now = struct.pack("<Q", inp["now_epoch_ms"])
            put("admission_observe", now + enc(inp["config"]) + b"\0" + enc(inp["snapshot"]) + b"\0" + enc(inp["headers"]))
        elif op == "classify_http":
            put("decode_observation", enc(inp["observation"]))
        elif op == "parse_retry_after":
            header = 0 if inp["header"].lower() == "retry-after" else 1
            cap = min(inp["cap_ms"], 2**64 - 1)
            put("retry_after", bytes([header]) + struct.pack("<QQ", inp["now_unix_ms"], cap) + enc(inp["value"]))
