// Shared by the fleet and store tests: a policy with a fleet section, store
// backends, the Redis gate (REDIS_URL from tests/servers/with-redis.sh) and
// the PostgreSQL gate (DATABASE_URL from tests/servers/with-postgres.sh).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { randomUUID } from "node:crypto";

import { policyWith } from "./helpers.mjs";

/**
 * The Redis URL, or the reason the test is skipped. Under make (MAKELEVEL
 * set) a missing REDIS_URL is a failure: make runs these tests under
 * tests/servers/with-redis.sh.
 * @returns {{url: string, skip: false} | {url: undefined, skip: string}}
 */
export function redisGate() {
  const url = process.env.REDIS_URL;
  if (url !== undefined && url !== "") return { url, skip: false };
  if (process.env.MAKELEVEL !== undefined) {
    throw new Error("REDIS_URL is not set: run the wasm tests under tests/servers/with-redis.sh (make does)");
  }
  return { url: undefined, skip: "REDIS_URL is not set (run under tests/servers/with-redis.sh)" };
}

/**
 * The PostgreSQL URL, or the reason the test is skipped. Under make
 * (MAKELEVEL set) a missing DATABASE_URL is a failure: make runs these tests
 * under tests/servers/with-postgres.sh.
 * @returns {{url: string, skip: false} | {url: undefined, skip: string}}
 */
export function postgresGate() {
  const url = process.env.DATABASE_URL;
  if (url !== undefined && url !== "") return { url, skip: false };
  if (process.env.MAKELEVEL !== undefined) {
    throw new Error("DATABASE_URL is not set: run the wasm tests under tests/servers/with-postgres.sh (make does)");
  }
  return { url: undefined, skip: "DATABASE_URL is not set (run under tests/servers/with-postgres.sh)" };
}

/** A fresh namespace for one test. @param {string} name */
export function namespace(name) {
  return `t-${name}-${randomUUID().slice(0, 8)}`;
}

/** A temporary SQLite file path (its directory removed at exit). */
export function tempDbPath() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "retryledger-fleet-"));
  process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, "fleet.db");
}

/**
 * The reference policy with a fleet section.
 * @param {Partial<import("../dist/index.js").FleetConfig>} [fleet]
 * @param {(p: import("../dist/index.js").Policy) => void} [change]
 */
export function fleetPolicy(fleet = {}, change) {
  return policyWith((p) => {
    p.fleet = {
      breaker: { consecutive_failures: 2, half_open_probes: 1, open_ms: 60000 },
      on_store_unavailable: "fail_closed",
      ...fleet,
    };
    if (change !== undefined) change(p);
  });
}
