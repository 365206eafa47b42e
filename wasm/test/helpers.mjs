// Shared by the tests: the lab's reference policy, variants of it, and a fake clock.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import { createHash } from "node:crypto";

const here = path.dirname(fileURLToPath(import.meta.url));

/** The raw idempotency key whose SHA-256 the reference policy carries. */
export const KEY = "idempotency-key: tenant-7/op-summarize/INC-4471";

/** @returns {import("../dist/index.js").Policy} */
function loadReference() {
  const file = path.resolve(here, "../../tests/vectors/plan.json");
  const doc = JSON.parse(fs.readFileSync(file, "utf8"));
  const c = doc.cases.find((/** @type {{name: string}} */ x) => x.name === "empty_run_dispatches_primary");
  if (c === undefined) throw new Error("reference policy not found in plan.json");
  return JSON.parse(c.input.policy);
}

/** A fresh copy of the reference policy (the lab's baseline). */
export function referencePolicy() {
  return loadReference();
}

/**
 * The reference policy with changes applied.
 * @param {(p: import("../dist/index.js").Policy) => void} change
 */
export function policyWith(change) {
  const p = referencePolicy();
  change(p);
  return p;
}

/** A policy for `key` instead of the reference key. @param {string} key */
export function policyForKey(key) {
  return policyWith((p) => {
    p.idempotency_key_sha256 = createHash("sha256").update(key, "utf8").digest("hex");
  });
}

/** A clock that only moves when told, and a sleep that moves it. */
export function fakeTime() {
  const state = { now: 0, sleeps: /** @type {number[]} */ ([]) };
  return {
    state,
    clock: () => state.now,
    /** @param {number} ms */
    sleep: async (ms) => {
      state.sleeps.push(ms);
      state.now += ms;
    },
    /** @param {number} ms */
    advance: (ms) => {
      state.now += ms;
    },
  };
}
