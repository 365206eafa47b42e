// Drives the inspector in Debian's Chromium (headless, no browser download):
// serves the built page on 127.0.0.1, loads the baseline, a mutated bundle,
// a policy error, garbage, another schema and an oversize input, checks the
// timeline's lanes and bars, phone width, keyboard access, and saves
// screenshots of the three states to target/screenshots/.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { mkdtemp, mkdir, readFile, rm, stat } from "node:fs/promises";
import { existsSync, readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const site = process.env.INSPECTOR_DIR ?? path.join(repo, "target", "inspector");
const shots = path.join(repo, "target", "screenshots");
const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".json": "application/json", ".wasm": "application/wasm", ".png": "image/png" };

let server;
let base;
let context;
let profile;
const pageErrors = [];
const offsite = [];

function serve(root) {
  return http.createServer(async (req, res) => {
    const url = new URL(req.url, "http://127.0.0.1");
    const rel = decodeURIComponent(url.pathname === "/" ? "/index.html" : url.pathname);
    const file = path.join(root, path.normalize(rel));
    if (!file.startsWith(root)) {
      res.writeHead(403).end();
      return;
    }
    try {
      const body = await readFile(file);
      res.writeHead(200, { "content-type": TYPES[path.extname(file)] ?? "application/octet-stream" }).end(body);
    } catch {
      res.writeHead(404).end("not found");
    }
  });
}

before(async () => {
  assert.ok(existsSync(path.join(site, "index.html")), `build the page first (make inspector-build): ${site}`);
  assert.ok(existsSync(chromiumPath), `Debian's chromium is missing at ${chromiumPath}`);
  await mkdir(shots, { recursive: true });
  server = serve(site);
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}/`;
  profile = await mkdtemp(path.join(os.tmpdir(), "inspector-profile-"));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  context.on("request", (r) => {
    if (!r.url().startsWith(base) && !r.url().startsWith("data:") && !r.url().startsWith("blob:")) offsite.push(r.url());
  });
});

after(async () => {
  await context?.close();
  server?.close();
  if (profile) await rm(profile, { recursive: true, force: true });
});

async function open(viewport) {
  const page = await context.newPage();
  if (viewport) await page.setViewportSize(viewport);
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  page.on("console", (m) => {
    if (m.type() === "error") pageErrors.push(m.text());
  });
  await page.goto(base);
  await page.waitForFunction(() => document.getElementById("verdict").textContent.includes("Ready"));
  await page.waitForFunction(() => !document.getElementById("case-select").disabled);
  return page;
}

async function loadCase(page, name) {
  const value = await page.$eval("#case-select", (s, n) => [...s.options].find((o) => o.text.startsWith(`${n} —`))?.value, name);
  assert.ok(value !== undefined, `lab case ${name} is in the menu`);
  await page.selectOption("#case-select", value);
  await page.click("#case-load");
}

const verdict = (page) => page.$eval("#verdict", (v) => ({ cls: v.className, text: v.textContent }));

test("the baseline verifies and draws one lane per route and one bar per attempt", async () => {
  const page = await open();
  await loadCase(page, "valid_success");
  const v = await verdict(page);
  assert.match(v.cls, /verified/);
  assert.match(v.text, /Verified: completed/);
  assert.equal(await page.locator('[data-testid="route-lane"]').count(), 2);
  assert.equal(await page.locator('[data-testid="attempt-bar"]').count(), 3);
  assert.equal(await page.locator('[data-testid="deadline"]').count(), 1);
  const digests = await page.$$eval('[data-testid="digest"]', (d) => d.map((x) => x.textContent));
  const lab = JSON.parse(await readFile(path.join(site, "lab.json"), "utf8"));
  assert.equal(digests[0], lab.policy_sha256);
  assert.equal(digests[1], lab.attempts_sha256);
  assert.equal(digests[2], lab.receipt_sha256);
  const meters = await page.locator('[data-testid="meter"]').count();
  assert.equal(meters, 6, "total, two routes, cost spent, cost reserved, time");
  await page.screenshot({ path: path.join(shots, "verified.png"), fullPage: true });
  await page.close();
});

test("a mutated bundle shows its first drift with code, attempt and field", async () => {
  const page = await open();
  await loadCase(page, "early_start");
  const v = await verdict(page);
  assert.match(v.cls, /drift/);
  assert.match(v.text, /early_start/);
  assert.match(v.text, /attempt 2/);
  assert.match(v.text, /started_at_ms/);
  assert.equal(await page.locator('[data-testid="attempt-bar"]').count(), 3);
  assert.deepEqual(await page.$$eval(".bar.drifted", (b) => b.map((x) => x.getAttribute("data-ordinal"))), ["2"]);
  await page.screenshot({ path: path.join(shots, "drift.png"), fullPage: true });
  await page.close();
});

test("a jittered bundle draws its jitter intervals", async () => {
  const page = await open();
  await loadCase(page, "jitter_replay");
  assert.match((await verdict(page)).text, /Verified/);
  assert.equal(await page.locator(".jitter-band").count(), 2);
  await page.close();
});

test("a policy the core rejects is shown as a policy error", async () => {
  const page = await open();
  await loadCase(page, "boundary_drift");
  const v = await verdict(page);
  assert.match(v.cls, /error/);
  assert.match(v.text, /Policy rejected/);
  assert.match(v.text, /data_boundary_exceeded/);
  await page.close();
});

test("streamed and fleet runs: delivered events marked on their attempts, admissions shown with their snapshots", async () => {
  const vectors = (file) => JSON.parse(readFileSync(path.join(repo, "tests", "vectors", file), "utf8")).cases;
  const bundleOf = (file, name) => vectors(file).find((c) => c.name === name).input.bundle;
  const page = await open();
  await page.$eval("#paste-input", (t, s) => (t.value = s), bundleOf("stream.json", "stream_verify_sealed"));
  await page.click("#paste-verify");
  let v = await verdict(page);
  assert.match(v.text, /Verified: completed/);
  const marks = await page.$$eval('[data-testid="stream-mark"]', (els) => els.map((e) => [e.getAttribute("data-ordinal"), e.getAttribute("data-status")]));
  assert.deepEqual(marks, [
    ["1", "invalidated"],
    ["2", "committed"],
  ]);
  await page.$eval("#paste-input", (t, s) => (t.value = s), bundleOf("fleet.json", "fleet_verify_skip"));
  await page.click("#paste-verify");
  v = await verdict(page);
  assert.match(v.text, /Verified: completed/);
  const titles = await page.$$eval('[data-testid="admission"] title', (els) => els.map((e) => e.textContent));
  assert.equal(titles.length, 1);
  assert.match(titles[0], /breaker closed, generation 0; budget deposit/);
  assert.match(titles[0], /skipped private-primary/);
  await page.$eval("#paste-input", (t, s) => (t.value = s), bundleOf("fleet.json", "fleet_verify_circuit_open_stop"));
  await page.click("#paste-verify");
  assert.match(await page.$eval('[data-testid="fleet-stop"]', (e) => e.textContent), /fleet stop: circuit open/);
  await page.screenshot({ path: path.join(shots, "fleet.png"), fullPage: true });
  await page.close();
});

test("a hedged run: overlapping attempts drawn, the hedge linked to its lead, the loser and the winner marked", async () => {
  const cases = JSON.parse(readFileSync(path.join(repo, "tests", "vectors", "hedge.json"), "utf8")).cases;
  const page = await open();
  await page.$eval("#paste-input", (t, s) => (t.value = s), cases.find((c) => c.name === "hedge_bundle_verified").input.bundle);
  await page.click("#paste-verify");
  const v = await verdict(page);
  assert.match(v.text, /Verified: completed/);
  const bars = await page.$$eval('[data-testid="attempt-bar"]', (els) =>
    els.map((e) => ({
      ordinal: e.getAttribute("data-ordinal"),
      loss: e.getAttribute("data-loss"),
      hedges: e.getAttribute("data-hedges"),
      x: Number(e.getAttribute("x")),
      end: Number(e.getAttribute("x")) + Number(e.getAttribute("width")),
    })),
  );
  assert.deepEqual(
    bars.map((b) => [b.ordinal, b.loss, b.hedges]),
    [
      ["1", "cancelled", null],
      ["2", null, "1"],
    ],
  );
  const [lead, hedge] = bars;
  assert.ok(lead !== undefined && hedge !== undefined && hedge.x < lead.end, "the two attempts overlap in time");
  assert.equal(await page.$eval('[data-testid="winner"]', (e) => e.getAttribute("data-ordinal")), "2");
  assert.match(await page.$eval('[data-testid="winner"] title', (e) => e.textContent ?? ""), /winner: attempt 2/);
  assert.match(await page.$eval('[data-testid="hedge-link"] title', (e) => e.textContent ?? ""), /hedge 1 of attempt 1: threshold 200 ms/);
  await page.screenshot({ path: path.join(shots, "hedge.png"), fullPage: true });
  await page.close();
});

test("garbage, another schema and oversize input get clear messages", async () => {
  const page = await open();
  await page.fill("#paste-input", "this is not json {");
  await page.click("#paste-verify");
  let v = await verdict(page);
  assert.match(v.cls, /error/);
  assert.match(v.text, /Not JSON/);
  assert.equal(await page.isHidden("#report"), true);
  await page.screenshot({ path: path.join(shots, "garbage.png"), fullPage: true });

  await page.fill("#paste-input", '{"schema":"retryledger.policy.v1"}');
  await page.click("#paste-verify");
  v = await verdict(page);
  assert.match(v.text, /Not a receipt bundle/);

  // Bundles may reach 32 MiB (a stream event log); one byte more is refused.
  await page.$eval("#paste-input", (t) => (t.value = JSON.stringify({ schema: "retryledger.bundle.v1", pad: "x".repeat(32 * 1024 * 1024) })));
  await page.click("#paste-verify");
  v = await verdict(page);
  assert.match(v.text, /input_too_large/);

  await page.fill("#paste-input", '{"schema":"retryledger.bundle.v1","policy":{}}');
  await page.click("#paste-verify");
  v = await verdict(page);
  assert.match(v.text, /does not decode/);
  assert.match(v.text, /missing_field|unknown_field/);
  await page.close();
});

test("controls are labelled and reachable by keyboard", async () => {
  const page = await open();
  const unlabelled = await page.$$eval("input, select, textarea", (els) =>
    els.filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label")).map((e) => e.id),
  );
  assert.deepEqual(unlabelled, []);
  await page.focus("#case-select");
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement.id), "case-load");
  await page.keyboard.press("Enter");
  assert.match((await verdict(page)).text, /Verified|Drift|rejected/);
  await page.close();
});

test("readable at phone width without horizontal scrolling", async () => {
  const page = await open({ width: 390, height: 844 });
  await loadCase(page, "valid_success");
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 1, `page overflows by ${overflow}px`);
  await page.screenshot({ path: path.join(shots, "phone.png"), fullPage: true });
  await page.close();
});

test("no page errors and no request leaves the page's own server", async () => {
  assert.deepEqual(pageErrors, []);
  assert.deepEqual(offsite, []);
  for (const s of ["verified.png", "drift.png", "garbage.png"]) assert.ok((await stat(path.join(shots, s))).size > 10_000, s);
});
