// Admission limits across 8 processes sharing one Redis store and one
// loopback server that counts the requests it holds at once: a route cap of
// 4 in flight and 20 requests per second (burst 1). The server never holds
// more than 4 requests nor sees more requests in any window than the rate
// allows, and every run's queue wait adds up with the server's log.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import http from "node:http";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { namespace, redisGate } from "./fleet-helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const child = path.join(here, "fleet-admission-child.mjs");
const run = promisify(execFile);
const redis = redisGate();
const CAP = 4;
const PER_SECOND = 20;
const BURST = 1;
const HOLD_MS = 250;

/** The most of `times` inside any window [t, t + w). @param {number[]} times @param {number} w */
function mostInWindow(times, w) {
  const t = [...times].sort((a, b) => a - b);
  let best = 0;
  for (let i = 0, j = 0; i < t.length; i++) {
    while ((t[j] ?? 0) <= (t[i] ?? 0) - w) j++;
    best = Math.max(best, i - j + 1);
  }
  return best;
}

test("8 processes through Redis never exceed a cap of 4 in flight nor 20 requests per second", { skip: redis.skip, timeout: 120000 }, async () => {
  let inFlight = 0;
  let peak = 0;
  /** @type {Map<string, number>} */
  const arrivals = new Map();
  const server = http.createServer((req, res) => {
    arrivals.set(String(req.headers["x-run"]), Date.now());
    inFlight++;
    peak = Math.max(peak, inFlight);
    setTimeout(() => {
      inFlight--;
      res.end("ok");
    }, HOLD_MS);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", () => r(undefined)));
  const address = /** @type {import("node:net").AddressInfo} */ (server.address());
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "rl-admission-"));
  const go = path.join(dir, "go");
  const args = {
    target: redis.url,
    namespace: namespace("admission-8"),
    seconds: 4,
    server: `http://127.0.0.1:${address.port}/model`,
    go,
    admission: { max_in_flight: CAP, max_queue_ms: 20000, request_burst: BURST, requests_per_second: PER_SECOND },
  };
  try {
    const children = Array.from({ length: 8 }, () => run(process.execPath, [child, JSON.stringify(args)], { cwd: path.dirname(here), timeout: 90000 }));
    await new Promise((r) => setTimeout(r, 1500)); // every process connected and waiting
    fs.writeFileSync(go, "go");
    const reports = (await Promise.all(children)).map((c) => JSON.parse(c.stdout));
    const rows = reports.flatMap((r) => r.rows);
    assert.ok(rows.length > 0 && rows.every((r) => r.terminal === "completed"), JSON.stringify(rows.slice(0, 3)));
    assert.equal(arrivals.size, rows.length);
    // 1. Never more than the cap at once, and the cap was reached.
    assert.ok(peak <= CAP, `peak ${peak}`);
    assert.equal(peak, CAP);
    // 2. The rate, on the admitted starts and (widened by the largest
    // start-to-arrival lag) on the server's arrivals.
    const starts = rows.map((r) => r.limits.start_epoch_ms);
    const delays = rows.map((r) => (arrivals.get(r.run) ?? 0) - r.limits.start_epoch_ms);
    assert.ok(Math.min(...delays) >= 0, `${Math.min(...delays)}`);
    const lag = Math.max(...delays);
    const seen = [...arrivals.values()];
    const windows = {};
    for (const w of [50, 100, 250, 1000, 2000]) {
      const planned = mostInWindow(starts, w);
      const allowed = BURST + Math.floor(((w - 1) * PER_SECOND) / 1000);
      assert.ok(planned <= allowed, `${w}: ${planned} > ${allowed}`);
      const arrived = mostInWindow(seen, w);
      assert.ok(arrived <= BURST + Math.floor(((w - 1 + lag) * PER_SECOND) / 1000), `${w}: ${arrived}, lag ${lag}`);
      /** @type {any} */ (windows)[w] = [planned, arrived, allowed];
    }
    // 3. Queue waits add up with the server's log.
    const overheads = rows.map((r) => {
      assert.equal(r.receipt_queue_wait_ms, r.limits.queue_wait_ms);
      const toServer = (arrivals.get(r.run) ?? 0) - r.called_epoch_ms;
      assert.ok(toServer >= r.limits.queue_wait_ms - 1, `${toServer} < ${r.limits.queue_wait_ms}`);
      return toServer - r.limits.queue_wait_ms;
    });
    const mean = overheads.reduce((a, b) => a + b, 0) / overheads.length;
    // The overhead is milliseconds on a quiet machine; 100 ms leaves room for a loaded one.
    assert.ok(mean < 100, `mean overhead ${mean}`);
    assert.equal(
      reports.reduce((a, r) => a + r.verified, 0),
      reports.reduce((a, r) => a + Math.min(r.rows.length, 5), 0),
    );
    const wait = rows.reduce((a, r) => a + r.limits.queue_wait_ms, 0);
    const conflicts = reports.reduce((a, r) => a + r.stats.conflicts, 0);
    console.log(
      `admission: 8 processes, ${rows.length} runs; server peak in flight ${peak}; windows (planned, arrived, allowed) ${JSON.stringify(windows)}; ` +
        `lag max ${lag} ms; queue waits ${wait} ms, overhead mean ${mean.toFixed(1)} ms max ${Math.max(...overheads)} ms; ${conflicts} conflicts`,
    );
  } finally {
    server.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
