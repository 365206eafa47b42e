// Key pools through the npm package (docs/FLEET.md, "Key pools"): keys are
// named by digests only, taken in turn, a refused key is never taken again,
// a limited one not before its hint, and bad arguments are coded errors.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";

import * as rl from "../dist/index.js";

const SECRETS = ["sk-pool-a", "sk-pool-b", "sk-pool-c", "sk-pool-d"];
const EPOCH = 1_780_000_000_000;

/** @param {rl.KeyPoolSelectResult} answer */
function keyOf(answer) {
  assert.equal(answer.selection.kind, "key");
  return answer.selection.kind === "key" ? answer.selection.key_sha256 : "";
}

const config = () => ({
  cool_ms: 1_000,
  keys: SECRETS.map((s) => ({ key_sha256: rl.keySha256(s) })),
  name: "openai-keys",
  park_ms: 60_000,
});

test("a key is named by the digest of its secret", () => {
  assert.equal(rl.keySha256("sk-pool-a"), createHash("sha256").update("sk-pool-a").digest("hex"));
});

test("keys in turn, a refused key never again, a limited one not before its hint", () => {
  const cfg = config();
  const digests = cfg.keys.map((k) => k.key_sha256);
  const [, refused = "", limited = ""] = digests;
  let snapshot = null;
  const documents = [];
  const picked = [];
  let now = EPOCH;
  for (let i = 0; i < 4; i++) {
    const answer = rl.keyPoolSelect(cfg, snapshot, now);
    snapshot = answer.snapshot;
    picked.push(keyOf(answer));
    documents.push(JSON.stringify(answer));
    now += 1;
  }
  assert.deepEqual([...picked].sort(), [...digests].sort(), "each key once in four calls");
  snapshot = rl.keyPoolRecord(cfg, snapshot, refused, { class: "non_retryable", kind: "rejected" }, now, 401);
  snapshot = rl.keyPoolRecord(cfg, snapshot, limited, { class: "retryable", kind: "rate_limited", retry_after_ms: 5_000 }, now, 429);
  documents.push(JSON.stringify(snapshot));
  const limitedUntil = now + 5_000;
  for (let step = 0; step < 12; step++) {
    const at = now + step * 1_000;
    const answer = rl.keyPoolSelect(cfg, snapshot, at);
    snapshot = answer.snapshot;
    documents.push(JSON.stringify(answer));
    const chosen = keyOf(answer);
    assert.notEqual(chosen, refused, "a refused key is never taken again");
    if (at < limitedUntil) assert.notEqual(chosen, limited, "a limited key is not taken before its hint");
  }
  for (const doc of documents) for (const secret of SECRETS) assert.ok(!doc.includes(secret));
});

test("bad arguments are coded", () => {
  const cfg = config();
  // @ts-expect-error a string where a number belongs
  assert.throws(() => rl.keyPoolSelect(cfg, null, "now"), (e) => e instanceof rl.DecodeError && e.code === "invalid_type");
  // @ts-expect-error a number where a string belongs
  assert.throws(() => rl.keySha256(7), (e) => e instanceof rl.DecodeError && e.code === "invalid_type");
  assert.throws(
    () => rl.keyPoolRecord(cfg, null, "0".repeat(64), { class: "success" }, EPOCH),
    (e) => e instanceof rl.PolicyError && e.code === "key_not_in_pool",
  );
});

test("a refused key records its reason; disable_ms lets it back, a configuration change too", () => {
  const ring = new rl.KeyRing(SECRETS);
  const timed = rl.poolConfig("openai-keys", ring, { coolMs: 1_000, parkMs: 60_000, disableMs: 5_000 });
  const [first = ""] = timed.keys.map((k) => k.key_sha256);
  const held = rl.keyPoolRecord(timed, null, first, { class: "non_retryable", kind: "policy_denied" }, EPOCH, 403);
  assert.equal(held.keys[0]?.state, "disabled");
  assert.equal(held.keys[0]?.reason, "forbidden");
  assert.equal(held.keys[0]?.until_epoch_ms, EPOCH + 5_000);
  assert.notEqual(keyOf(rl.keyPoolSelect(timed, held, EPOCH + 4_999, first)), first, "held until disable_ms has passed");
  const back = rl.keyPoolSelect(timed, held, EPOCH + 5_000, first);
  assert.equal(keyOf(back), first);
  assert.equal(back.snapshot.keys[0]?.reason, undefined);
  // Without disable_ms the key stays disabled until the configuration changes.
  const plain = rl.poolConfig("openai-keys", ring, { coolMs: 1_000, parkMs: 60_000 });
  const revoked = rl.keyPoolRecord(plain, null, first, { class: "non_retryable", kind: "rejected" }, EPOCH, 401);
  assert.equal(revoked.keys[0]?.reason, "unauthorized");
  assert.equal(revoked.keys[0]?.until_epoch_ms, undefined);
  assert.notEqual(keyOf(rl.keyPoolSelect(plain, revoked, EPOCH + 86_400_000, first)), first);
  const rotated = rl.poolConfig("openai-keys", ring, { coolMs: 2_000, parkMs: 60_000 });
  assert.equal(keyOf(rl.keyPoolSelect(rotated, revoked, EPOCH + 1, first)), first, "a changed configuration re-enables it");
  assert.throws(
    () => rl.keyPoolSelect({ ...plain, disable_ms: 0 }, null, EPOCH),
    (e) => e instanceof rl.PolicyError && e.code === "invalid_key_pool",
  );
});
