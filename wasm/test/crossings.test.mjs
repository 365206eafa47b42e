// What a run's hot path receives from the module as numbers rather than
// text: the rule of an observation and the terminal of the decision, each a
// position in the core's tables (wasm/ts/tables.ts). They must name what the
// core names: the same rule as the core's judgement, the same terminal as
// the session's.
import assert from "node:assert/strict";
import fs from "node:fs";
import test from "node:test";

import * as rl from "../dist/index.js";
import { preparedFacts } from "../dist/facts.js";

/** The conformance vectors' reference policy, cut to one route of three attempts. */
function policy() {
  const doc = JSON.parse(fs.readFileSync(new URL("../../tests/vectors/plan.json", import.meta.url), "utf8"));
  const c = doc.cases.find((/** @type {{name: string}} */ x) => x.name === "empty_run_dispatches_primary");
  const p = JSON.parse(c.input.policy);
  p.routes = [{ ...p.routes[0], max_attempts: 3 }];
  p.max_total_attempts = 3;
  p.backoff = { base_ms: 1, max_ms: 1, retry_after_cap_ms: 1 };
  return new rl.CompiledPolicy(p);
}

test("rules and terminals that cross as positions name the core's rules and terminals", () => {
  const compiled = policy();
  const errors = [
    [rl.AttemptError.nonRetryable("rejected")],
    [rl.AttemptError.indeterminate("unknown_provider_acceptance")],
    [rl.AttemptError.retryable("unavailable"), rl.AttemptError.retryable("rate_limited"), rl.AttemptError.retryable("unavailable")],
    [rl.AttemptError.retryable("unavailable"), undefined],
  ];
  /** @type {Set<string>} */
  const terminals = new Set();
  for (const run of errors) {
    const session = compiled.session();
    let t = 0;
    for (const error of run) {
      const d = session.next();
      assert.equal(d.kind, "dispatch");
      t = Math.max(t, /** @type {import("../dist/index.js").DispatchDecision} */ (d).not_before_ms);
      if (error === undefined) {
        const j = session.observe({ started_at_ms: t, completed_at_ms: t, facts: rl.RETURNED });
        assert.deepEqual(j, rl.judge({ result: "returned" }));
        continue;
      }
      const prepared = preparedFacts(error);
      assert.ok(prepared !== undefined);
      const j = session.observePrepared(t, t, undefined, prepared, error.outcome);
      assert.deepEqual(j, rl.judge({ result: "raised", outcome: error.outcome }));
    }
    const end = session.next();
    assert.equal(end.kind, "terminal");
    const name = /** @type {{terminal: string}} */ (end).terminal;
    assert.equal(name, session.terminal);
    assert.ok(rl.TERMINALS.includes(/** @type {any} */ (name)));
    terminals.add(name);
    session.free();
  }
  assert.equal(terminals.size, 4, [...terminals].join(", "));
});
