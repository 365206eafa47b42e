// Output checks and repair with the real `openai` and `@anthropic-ai/sdk`
// packages against a provider on 127.0.0.1: answers that arrive with HTTP 200
// and are wrong (empty, unparsable JSON, failing a schema, cut at the token
// limit, refused) give their outcomes; a refusal never reaches the second
// route; a repaired request reaches the server as a new request (its own
// body, request digest and Idempotency-Key).
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

import * as rl from "../dist/index.js";
import { openaiAnswerChecks, runWithOpenAI } from "../dist/openai-node.js";
import { anthropicAnswerChecks, runWithAnthropic } from "../dist/anthropic-node.js";
import { KEY, policyWith, referencePolicy } from "./helpers.mjs";

const { RunStoppedError, outputCheck, requestSha256, verifyRepairChain } = rl;

const PRIMARY = "private-primary";
const FALLBACK = "external-fallback";
const GOOD = '{"title":"disk full","severity":2}';

/** A check function: title (string) and severity (integer) required. */
const summary = outputCheck(
  (text) => {
    let v;
    try {
      v = JSON.parse(String(text));
    } catch {
      return { verdict: "defects", kind: "unparsable_json", defects: [{ message: "not JSON" }] };
    }
    const defects = [];
    if (typeof v?.title !== "string") defects.push({ message: "Required", path: "/title" });
    if (!Number.isInteger(v?.severity)) defects.push({ message: "Required", path: "/severity" });
    return defects;
  },
  { validator: "summary" },
);

/**
 * Each route answers its bodies in order (repeating the last), HTTP 200;
 * every request is kept as {route, key, body}.
 * @param {Record<string, unknown[]>} answers
 */
async function provider(answers) {
  /** @type {{route: string, key: string | undefined, body: any}[]} */
  const requests = [];
  const server = http.createServer((req, res) => {
    const chunks = /** @type {Buffer[]} */ ([]);
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const route = String(req.url).split("/")[1] ?? "";
      const n = requests.filter((r) => r.route === route).length;
      const key = req.headers["idempotency-key"];
      requests.push({ route, key: Array.isArray(key) ? key[0] : key, body: JSON.parse(Buffer.concat(chunks).toString() || "{}") });
      const script = answers[route] ?? [];
      const payload = JSON.stringify(script[Math.min(n, script.length - 1)]);
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(payload) });
      res.end(payload);
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = /** @type {import("node:net").AddressInfo} */ (server.address());
  return {
    requests,
    base: `http://127.0.0.1:${address.port}`,
    /** @param {string} route */
    count: (route) => requests.filter((r) => r.route === route).length,
    close: () => new Promise((resolve) => server.close(() => resolve(undefined))),
  };
}

/** @param {string | null} content @param {string} [finish] @param {string} [refusal] */
function chat(content, finish = "stop", refusal) {
  /** @type {Record<string, unknown>} */
  const message = { role: "assistant", content };
  if (refusal !== undefined) message.refusal = refusal;
  return { id: "chatcmpl-1", object: "chat.completion", created: 0, model: "fake-model", choices: [{ index: 0, message, finish_reason: finish }] };
}

/** @param {string | null} text @param {string} [stop] */
function message(text, stop = "end_turn") {
  return {
    id: "msg_1",
    type: "message",
    role: "assistant",
    model: "fake-model",
    content: text === null ? [] : [{ type: "text", text }],
    stop_reason: stop,
    stop_sequence: null,
    usage: { input_tokens: 10, output_tokens: 5 },
  };
}

/** @param {any} step */
const messagesOf = (step) => (step.request !== undefined ? step.request.input : [{ role: "user", content: "summarize INC-4471 as JSON" }]);

/** @param {string} sdk @param {string} base @param {unknown} policy @param {Record<string, unknown>} options */
function ask(sdk, base, policy, options) {
  if (sdk === "openai") {
    const clients = {
      [PRIMARY]: new OpenAI({ apiKey: "test", baseURL: `${base}/${PRIMARY}`, maxRetries: 0 }),
      [FALLBACK]: new OpenAI({ apiKey: "test", baseURL: `${base}/${FALLBACK}`, maxRetries: 0 }),
    };
    return runWithOpenAI(
      /** @type {any} */ (policy),
      clients,
      (client, opts, step) => client.chat.completions.create({ model: "fake-model", messages: messagesOf(step), response_format: { type: "json_object" } }, opts),
      { idempotencyKey: KEY, checks: openaiAnswerChecks({ json: true, validators: [summary] }), ...options },
    );
  }
  const clients = {
    [PRIMARY]: new Anthropic({ apiKey: "test", baseURL: `${base}/${PRIMARY}`, maxRetries: 0 }),
    [FALLBACK]: new Anthropic({ apiKey: "test", baseURL: `${base}/${FALLBACK}`, maxRetries: 0 }),
  };
  return runWithAnthropic(
    /** @type {any} */ (policy),
    clients,
    (client, opts, step) => client.messages.create({ model: "fake-model", max_tokens: 256, messages: messagesOf(step) }, opts),
    { idempotencyKey: KEY, checks: anthropicAnswerChecks({ json: true, validators: [summary] }), ...options },
  );
}

const CASES = /** @type {const} */ ([
  ["empty", chat(""), message(null), "empty", "invalid_output"],
  ["unparsable", chat('{"title": "disk'), message('{"title": "disk'), "unparsable_json", "invalid_output"],
  ["schema", chat('{"title": "disk full"}'), message('{"title": "disk full"}'), "schema", "invalid_output"],
  ["truncated", chat('{"title": "di', "length"), message('{"title": "di', "max_tokens"), "truncated", "invalid_output"],
  ["refusal", chat(null, "stop", "I can't help with that."), message("I can't help with that.", "refusal"), "refusal", "policy_denied"],
]);

for (const sdk of ["openai", "anthropic"]) {
  for (const [name, chatAnswer, messageAnswer, kind, outcome] of CASES) {
    test(`${sdk}: ${name} gives ${outcome} and never reaches the fallback`, async () => {
      const good = sdk === "openai" ? chat(GOOD) : message(GOOD);
      const p = await provider({ [PRIMARY]: [sdk === "openai" ? chatAnswer : messageAnswer], [FALLBACK]: [good] });
      try {
        const err = /** @type {any} */ (await ask(sdk, p.base, referencePolicy(), {}).catch((e) => e));
        assert.ok(err instanceof RunStoppedError);
        assert.equal(err.code, "stop_non_retryable");
        const attempts = /** @type {any[]} */ (err.bundle.attempts.attempts);
        assert.equal(attempts.length, 1);
        assert.deepEqual(attempts[0].outcome, { class: "non_retryable", kind: outcome });
        assert.equal(attempts[0].output_check.kind, kind);
        assert.deepEqual([p.count(PRIMARY), p.count(FALLBACK)], [1, 0]);
        assert.equal(err.receipt.fallback_used, false);
      } finally {
        await p.close();
      }
    });
  }

  test(`${sdk}: a repaired request reaches the server as a new request`, async () => {
    const [bad, good] = sdk === "openai" ? [chat('{"title": "disk full"}'), chat(GOOD)] : [message('{"title": "disk full"}'), message(GOOD)];
    const p = await provider({ [PRIMARY]: [bad, good], [FALLBACK]: [good] });
    /** @param {unknown} _o @param {any[]} defects */
    const fix = (_o, defects) => ({
      schema: "retryledger.request.v1",
      operation: "chat",
      input: [
        { role: "user", content: "summarize INC-4471 as JSON" },
        { role: "user", content: `Your last answer was invalid (${defects.map((d) => `${d.path ?? ""} ${d.message}`).join("; ")}). Answer again.` },
      ],
    });
    try {
      const policy = policyWith((x) => {
        x.repair = { max_repairs: 1, cost_share_percent: 50 };
      });
      const r = /** @type {any} */ (await ask(sdk, p.base, policy, { repair: fix }));
      assert.equal(r.receipt.terminal, "completed");
      const [first, second] = p.requests;
      assert.deepEqual([first?.route, second?.route, p.count(FALLBACK)], [PRIMARY, PRIMARY, 0]);
      assert.equal(first?.key, KEY);
      assert.equal(second?.key, `${KEY}:repair:1`);
      assert.equal(second?.body.messages.length, 2);
      assert.match(second?.body.messages[1].content, /\/severity/);
      const [root, link] = r.chain.links;
      assert.equal(link.bundle.policy.logical_request_sha256, requestSha256(/** @type {any} */ (fix(undefined, [{ path: "/severity", message: "Required" }]))));
      assert.notEqual(link.bundle.policy.logical_request_sha256, root.bundle.policy.logical_request_sha256);
      assert.equal(link.parent_request_sha256, root.bundle.policy.logical_request_sha256);
      assert.equal(verifyRepairChain(r.chain).kind, "verified");
    } finally {
      await p.close();
    }
  });
}
