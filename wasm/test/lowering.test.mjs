// One logical request lowered per route: each body's digest is recomputed
// here from the body itself, and a history bound to Anthropic is refused on a
// Gemini-only route unless dropping is allowed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import * as rl from "../dist/index.js";

const cases = Object.fromEntries(
  JSON.parse(readFileSync(new URL("../../tests/vectors/lowering.json", import.meta.url), "utf8")).cases.map(
    (/** @type {{name: string}} */ c) => [c.name, c],
  ),
);

/** Sorted compact JSON: RFC 8785 for these bodies (integers and strings only). @param {unknown} v @returns {string} */
function jcs(v) {
  if (Array.isArray(v)) return `[${v.map(jcs).join(",")}]`;
  if (v && typeof v === "object") {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${jcs(/** @type {Record<string, unknown>} */ (v)[k])}`).join(",")}}`;
  }
  return JSON.stringify(v);
}

for (const name of ["lower_chat_tools_history", "lower_anthropic_bound_anthropic_kept", "lower_google_images"]) {
  test(`the body digest is the body's own: ${name}`, () => {
    const input = cases[name].input;
    const lowered = rl.lowerRequest(input.request, input.release, input.options);
    assert.equal(lowered.body_sha256, createHash("sha256").update(jcs(lowered.body)).digest("hex"));
    assert.deepEqual(rl.lowerRequest(JSON.parse(input.request), JSON.parse(input.release)), lowered);
  });
}

test("a thinking block on a Gemini-only route is refused, or dropped when allowed", () => {
  const input = cases.lower_google_bound_anthropic_refused.input;
  assert.throws(() => rl.lowerRequest(input.request, input.release), (/** @type {any} */ e) => {
    assert.ok(e instanceof rl.PolicyError);
    assert.equal(e.code, "provider_bound_history");
    assert.equal(e.path, "/messages/1/content/0");
    return true;
  });
  const dropped = rl.lowerRequest(input.request, input.release, { provider_bound_parts: "drop" });
  assert.ok(!JSON.stringify(dropped.body).includes("signature"));
  assert.deepEqual(dropped.notes, [{ path: "/messages/1/content/0", what: "dropped_provider_bound" }]);
});

test("no capable route before any dispatch", () => {
  const input = cases.build_thinking_history_gemini_only_refused.input;
  assert.throws(() => rl.buildPolicy(input.request, input.spec), (/** @type {any} */ e) => e.code === "no_capable_route");
  assert.deepEqual(rl.routeCapabilities(input.request, input.spec).routes, [
    { capable: false, code: "provider_bound_history", path: "/messages/1/content/0", route_id: "route-0" },
  ]);
});
