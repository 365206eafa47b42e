// runHedgedWithOpenAI with the real `openai` package (maxRetries: 0) against
// a fake provider on 127.0.0.1 whose primary route answers after SLOW_MS
// while `slow` is set: the hedge on the fallback wins those calls, the slow
// lead's request is aborted (the provider sees its connection close), every
// request carries the run's Idempotency-Key, and a client with SDK retries
// is refused before any request.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import OpenAI from "openai";

import * as rl from "../dist/index.js";
import { runHedgedWithOpenAI } from "../dist/openai.js";
import { KEY, referencePolicy } from "./helpers.mjs";

const SLOW_MS = 300;

async function tailProvider() {
  /** @type {{route: string, key: string | undefined, closed: boolean}[]} */
  const log = [];
  const state = { slow: false };
  const server = http.createServer((req, res) => {
    req.resume();
    const route = (req.url ?? "").split("/")[1] ?? "";
    const entry = { route, key: /** @type {string | undefined} */ (req.headers["idempotency-key"]), closed: false };
    log.push(entry);
    let answered = false;
    const timer = setTimeout(
      () => {
        answered = true;
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            id: `chatcmpl-${route}`,
            object: "chat.completion",
            created: 0,
            model: "fake-model",
            choices: [{ index: 0, message: { role: "assistant", content: route }, finish_reason: "stop" }],
          }),
        );
      },
      route === "primary" && state.slow ? SLOW_MS : 3,
    );
    res.on("close", () => {
      if (!answered) {
        clearTimeout(timer);
        entry.closed = true;
      }
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return {
    log,
    state,
    /** @param {string} route */
    url: (route) => `http://127.0.0.1:${port}/${route}/v1`,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r(undefined));
      }),
  };
}

function hedgedPolicy() {
  const p = referencePolicy();
  p.max_total_attempts = 6;
  for (const r of p.routes) r.max_attempts = 3;
  /** @type {import("../dist/index.js").HedgeSection} */
  const section = { cancelled_cost: "reserve", cost_share_percent: 50, delay_ms: 200, effects: "none", max_hedges: 1, routes: ["external-fallback"] };
  p.hedge = section;
  return p;
}

/** @param {OpenAI} client @param {import("../dist/openai.js").OpenAIRequestOptions} options */
const ask = (client, options) => client.chat.completions.create({ model: "fake-model", messages: [{ role: "user", content: "hi" }] }, options);

test("the hedge wins the slow calls, the slow lead is aborted, one key on every request", async () => {
  const provider = await tailProvider();
  try {
    const clients = {
      "private-primary": new OpenAI({ apiKey: "test", baseURL: provider.url("primary"), maxRetries: 0 }),
      "external-fallback": new OpenAI({ apiKey: "test", baseURL: provider.url("fallback"), maxRetries: 0 }),
    };
    // A first call opens the clients' connections.
    await runHedgedWithOpenAI(hedgedPolicy(), clients, ask, { idempotencyKey: KEY });
    await new Promise((r) => setTimeout(r, 20));
    provider.log.length = 0;
    const winners = [];
    for (const slow of [false, true, false, true]) {
      provider.state.slow = slow;
      const run = await runHedgedWithOpenAI(hedgedPolicy(), clients, ask, { idempotencyKey: KEY });
      assert.equal(run.terminal, "completed");
      const w = run.bundle.attempts.attempts.find((a) => a.ordinal === run.receipt.hedge?.winner_ordinal);
      assert.ok(w !== undefined);
      assert.equal(run.result?.choices[0]?.message.content, w.route_id === "private-primary" ? "primary" : "fallback");
      assert.equal(rl.verifyBundle(run.bundle_json).kind, "verified");
      winners.push(w.route_id);
    }
    assert.deepEqual(winners, ["private-primary", "external-fallback", "private-primary", "external-fallback"]);
    for (let i = 0; i < 200 && provider.log.filter((e) => e.closed && e.route === "primary").length < 2; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.ok(provider.log.every((e) => e.key === KEY));
    assert.equal(provider.log.filter((e) => e.closed && e.route === "primary").length, 2, "the two slow leads were aborted in flight");
  } finally {
    await provider.close();
  }
});

test("a client with SDK retries is refused before any request", async () => {
  const clients = {
    "private-primary": new OpenAI({ apiKey: "test", baseURL: "http://127.0.0.1:9/v1" }),
    "external-fallback": new OpenAI({ apiKey: "test", baseURL: "http://127.0.0.1:9/v1", maxRetries: 0 }),
  };
  await assert.rejects(
    runHedgedWithOpenAI(hedgedPolicy(), clients, ask, { idempotencyKey: KEY }),
    (e) => e instanceof rl.PolicyError && e.code === "retry_owner_not_harness",
  );
});
