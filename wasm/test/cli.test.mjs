// `npx retryledger verify BUNDLE.json` (the package's bin, dist/cli.js), run
// as a user runs it: python -m retryledger verify's exit codes and lines.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
const bin = fileURLToPath(new URL(`../${pkg.bin.retryledger}`, import.meta.url));
const cases = JSON.parse(readFileSync(new URL("../../tests/vectors/verify.json", import.meta.url), "utf8")).cases;
const good = cases.find((/** @type {{name: string}} */ c) => c.name === "lab_valid_success").input.bundle;

/** @param {string[]} args */
function cli(...args) {
  return spawnSync(process.execPath, [bin, ...args], { encoding: "utf8", timeout: 60_000 });
}

test("the package names its bin retryledger, with a node shebang", () => {
  assert.equal(pkg.bin.retryledger, "dist/cli.js");
  assert.ok(readFileSync(bin, "utf8").startsWith("#!/usr/bin/env node\n"));
});

test("verify: 0 verified, 1 drift, 2 bad input", () => {
  const dir = mkdtempSync(join(tmpdir(), "retryledger-cli-"));
  const ok = join(dir, "good.json");
  writeFileSync(ok, good);
  let r = cli("verify", ok);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^verified: completed, receipt sha256 [0-9a-f]{64}\n$/);

  const bundle = JSON.parse(good);
  bundle.attempts.attempts[1].started_at_ms = 1300;
  const drift = join(dir, "drift.json");
  writeFileSync(drift, JSON.stringify(bundle));
  r = cli("verify", drift);
  assert.equal(r.status, 1);
  assert.match(r.stdout, /^drift: early_start at \/attempts\/attempts\/1\/started_at_ms/);
  assert.equal(r.stdout.trim().split("\n").length, 1);

  const garbage = join(dir, "garbage.json");
  writeFileSync(garbage, "{not json");
  r = cli("verify", garbage);
  assert.equal(r.status, 2);
  assert.match(r.stderr, /^bad input: invalid_json/);

  r = cli("verify", join(dir, "missing.json"));
  assert.equal(r.status, 2);
  assert.match(r.stderr, /cannot read/);
});

for (const args of [[], ["verify"], ["nonsense"]]) {
  test(`usage is bad input: ${JSON.stringify(args)}`, () => {
    const r = cli(...args);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /usage/);
  });
}
