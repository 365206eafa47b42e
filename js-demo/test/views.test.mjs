// Drives the inspector's fleet and journal views in Debian's Chromium
// (headless, no browser download). Fleet: the full-outage scenario run in
// the page by the simulator's WebAssembly module gives the table the CLI
// prints (the README's block for seed 42, `cargo run -p retryledger-sim` for
// another seed) and the committed charts byte for byte. Journal: a clean
// journal, a broken chain, a takeover with a reconciled attempt, a crash in
// doubt, a fenced owner. Bad input in both views gets coded errors.
// Screenshots go to target/screenshots/.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { execFileSync } from "node:child_process";
import { mkdtemp, mkdir, readFile, rm, stat } from "node:fs/promises";
import { existsSync, readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { tableRows } from "../fleet.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const site = process.env.INSPECTOR_DIR ?? path.join(repo, "target", "inspector");
const shots = path.join(repo, "target", "screenshots");
const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const RUN_TIMEOUT = 180_000;

const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".json": "application/json", ".wasm": "application/wasm" };

let server;
let base;
let context;
let profile;
const pageErrors = [];
const offsite = [];

before(async () => {
  assert.ok(existsSync(path.join(site, "sim", "retryledger_sim_bg.wasm")), `build the page first (make inspector-build): ${site}`);
  assert.ok(existsSync(chromiumPath), `Debian's chromium is missing at ${chromiumPath}`);
  await mkdir(shots, { recursive: true });
  server = http.createServer(async (req, res) => {
    const url = new URL(req.url, "http://127.0.0.1");
    const rel = decodeURIComponent(url.pathname === "/" ? "/index.html" : url.pathname);
    const file = path.join(site, path.normalize(rel));
    if (!file.startsWith(site)) return void res.writeHead(403).end();
    try {
      const body = await readFile(file);
      res.writeHead(200, { "content-type": TYPES[path.extname(file)] ?? "application/octet-stream" }).end(body);
    } catch {
      res.writeHead(404).end("not found");
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}/`;
  profile = await mkdtemp(path.join(os.tmpdir(), "inspector-views-"));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  context.on("request", (r) => {
    const u = r.url();
    if (!u.startsWith(base) && !u.startsWith("data:") && !u.startsWith("blob:")) offsite.push(u);
  });
});

after(async () => {
  await context?.close();
  server?.close();
  if (profile) await rm(profile, { recursive: true, force: true });
});

async function open(view, viewport) {
  const page = await context.newPage();
  if (viewport) await page.setViewportSize(viewport);
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  page.on("console", (m) => {
    if (m.type() === "error") pageErrors.push(m.text());
  });
  await page.goto(`${base}#${view}`);
  return page;
}

// ---- fleet ----------------------------------------------------------------

const status = (page) => page.$eval("#fleet-status", (v) => ({ cls: v.className, text: v.textContent }));

async function openFleet(viewport) {
  const page = await open("fleet", viewport);
  await page.waitForFunction(() => document.getElementById("fleet-status").textContent.includes("Ready"), null, { timeout: 60_000 });
  return page;
}

async function runFleet(page) {
  await page.click("#fleet-run");
  await page.waitForFunction(() => !document.getElementById("fleet-status").textContent.includes("Running"), null, { timeout: RUN_TIMEOUT });
  return status(page);
}

const pageTable = (page) => page.$$eval("#fleet-table tr", (trs) => trs.map((tr) => [...tr.children].map((c) => c.textContent)));
const markdownOf = (text) => text.split("\n").filter((l) => l.startsWith("|")).join("\n") + "\n";

function readmeBlock(name) {
  const readme = readFileSync(path.join(repo, "README.md"), "utf8");
  const begin = `<!-- sim:${name}:begin -->\n`;
  const from = readme.indexOf(begin);
  const to = readme.indexOf(`<!-- sim:${name}:end -->`);
  assert.ok(from >= 0 && to > from, `README.md has the ${name} block`);
  return readme.slice(from + begin.length, to);
}

test("fleet: full outage, seed 42, is the README's table and the committed charts, byte for byte", { timeout: RUN_TIMEOUT }, async () => {
  const page = await openFleet();
  const names = await page.$$eval("#fleet-scenario option", (o) => o.map((x) => x.textContent.split(" — ")[0]));
  assert.deepEqual(names, ["full_outage", "brownout", "rate_limited", "slow_tail"]);
  assert.equal(await page.inputValue("#fleet-seed"), "42");
  assert.equal(await page.inputValue("#fleet-rate"), "1000");
  const s = await runFleet(page);
  assert.match(s.cls, /verified/, s.text);
  assert.match(s.text, /full_outage: seed 42, 60,392 logical requests over 60 s/);

  const block = readmeBlock("full_outage");
  const expected = markdownOf(block);
  assert.equal(await page.$eval("#fleet-markdown", (p) => p.textContent), expected, "the page's Markdown is the CLI's table");
  assert.deepEqual(await pageTable(page), tableRows(expected), "the HTML table holds the same cells");
  const rows = tableRows(expected);
  assert.equal(rows.length, 6, "header and five strategies");

  const downloads = await page.$$eval('[data-testid="fleet-download"]', (as) => as.map((a) => [a.getAttribute("download"), a.href]));
  assert.deepEqual(downloads.map((d) => d[0]), ["sim-full-outage-load.svg", "sim-full-outage-latency.svg", "sim-full-outage.json"]);
  for (const [name, href] of downloads.slice(0, 2)) {
    const text = await page.evaluate(async (u) => (await fetch(u)).text(), href);
    assert.equal(text, readFileSync(path.join(repo, "docs", name), "utf8"), `${name} is the committed chart`);
  }
  assert.equal(await page.locator("#fleet-load svg").count(), 1);
  assert.equal(await page.locator("#fleet-latency svg").count(), 1);
  await page.screenshot({ path: path.join(shots, "fleet-view.png"), fullPage: true });
  await page.close();
});

test("fleet: another seed and traffic give exactly what retryledger-sim prints", { timeout: RUN_TIMEOUT * 3 }, async () => {
  // The CLI on the same scenario: seed 7 and 500 requests per second.
  const dir = await mkdtemp(path.join(os.tmpdir(), "fleet-cli-"));
  try {
    const scenario = JSON.parse(readFileSync(path.join(repo, "sim", "scenarios", "full_outage.json"), "utf8"));
    scenario.arrivals.rate_per_s = 500;
    const file = path.join(dir, "full_outage.json");
    await import("node:fs/promises").then((fs) => fs.writeFile(file, JSON.stringify(scenario, null, 2)));
    const cli = execFileSync("cargo", ["run", "-q", "--release", "-p", "retryledger-sim", "--", file, "--seed", "7", "--no-charts"], {
      cwd: repo,
      encoding: "utf8",
      maxBuffer: 16 * 1024 * 1024,
    });
    const page = await openFleet();
    await page.fill("#fleet-seed", "7");
    await page.fill("#fleet-rate", "500");
    const s = await runFleet(page);
    assert.match(s.cls, /verified/, s.text);
    assert.match(s.text, /seed 7/);
    assert.equal(await page.$eval("#fleet-markdown", (p) => p.textContent), markdownOf(cli));
    assert.deepEqual(await pageTable(page), tableRows(markdownOf(cli)));
    await page.close();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("fleet: bad scenarios get the simulator's coded errors, and the page keeps working", { timeout: RUN_TIMEOUT }, async () => {
  const page = await openFleet();
  await page.click(".scenario-json summary");
  const tryText = async (text) => {
    await page.fill("#fleet-json", text);
    return runFleet(page);
  };
  let s = await tryText("this is not json {");
  assert.match(s.cls, /error/);
  assert.match(s.text, /invalid_json/);
  assert.equal(await page.isHidden("#fleet-report"), true);

  s = await tryText('{"schema": "retryledger.sim_scenario.v1"}');
  assert.match(s.text, /missing_field/);

  s = await tryText(JSON.stringify({ schema: "retryledger.policy.v1" }));
  assert.match(s.text, /invalid_value|missing_field/);

  // A page-sized run only: a million requests are the CLI's job.
  await page.selectOption("#fleet-scenario", "1");
  await page.selectOption("#fleet-scenario", "0");
  await page.fill("#fleet-rate", "100000");
  s = await runFleet(page);
  assert.match(s.text, /scenario_too_large/);

  await page.fill("#fleet-rate", "1000");
  await page.fill("#fleet-seed", "forty-two");
  s = await runFleet(page);
  assert.match(s.text, /invalid_value/);
  assert.match(s.text, /\/seed/);

  await page.$eval("#fleet-json", (t) => (t.value = " ".repeat(1024 * 1024 + 1)));
  await page.fill("#fleet-seed", "42");
  s = await runFleet(page);
  assert.match(s.text, /input_too_large/);

  // Still alive: a small valid run after all that (the brown-out scenario at a tenth of its traffic).
  await page.selectOption("#fleet-scenario", "1");
  await page.fill("#fleet-rate", "100");
  s = await runFleet(page);
  assert.match(s.cls, /verified/, s.text);
  await page.close();
});

test("fleet: a run can be stopped, and the next one runs", { timeout: RUN_TIMEOUT }, async () => {
  const page = await openFleet();
  await page.click("#fleet-run");
  await page.waitForFunction(() => !document.getElementById("fleet-cancel").disabled);
  await page.click("#fleet-cancel");
  const s = await status(page);
  assert.match(s.cls, /error/);
  assert.match(s.text, /Stopped/);
  assert.match(s.text, /cancelled/);
  assert.equal(await page.isDisabled("#fleet-run"), false);
  await page.selectOption("#fleet-scenario", "3");
  await page.fill("#fleet-rate", "100");
  assert.match((await runFleet(page)).cls, /verified/);
  // The slow tail runs six strategies: the five and the hedged one.
  assert.equal(await page.locator('[data-testid="fleet-row"]').count(), 6);
  await page.close();
});

test("fleet: a simulator module that does not load is a coded error, and the other views still work", async () => {
  // Its own page, without the error listeners: the 404 is the point.
  const page = await context.newPage();
  await page.route("**/sim/retryledger_sim_bg.wasm", (r) => r.fulfill({ status: 404, body: "not found" }));
  await page.goto(`${base}#fleet`);
  await page.waitForFunction(() => document.getElementById("fleet-status").className.includes("error"), null, { timeout: 60_000 });
  const s = await status(page);
  assert.match(s.text, /The simulator did not load/);
  assert.match(s.text, /internal/);
  await page.click("#tab-journal");
  await page.waitForFunction(() => !document.getElementById("journal-sample").disabled);
  await sample(page, "verify_reference_journal");
  assert.match((await jverdict(page)).cls, /verified/);
  await page.close();
});

// ---- journal --------------------------------------------------------------

const jverdict = (page) => page.$eval("#journal-verdict", (v) => ({ cls: v.className, text: v.textContent }));

async function openJournalView(viewport) {
  const page = await open("journal", viewport);
  await page.waitForFunction(() => !document.getElementById("journal-sample").disabled);
  return page;
}

async function sample(page, name) {
  const value = await page.$eval("#journal-sample", (s, n) => [...s.options].find((o) => o.dataset.name === n)?.value, name);
  assert.ok(value !== undefined, `sample ${name} is in the menu`);
  await page.selectOption("#journal-sample", value);
  await page.click("#journal-sample-load");
}

const chainRows = (page) =>
  page.$$eval('[data-testid="chain-row"]', (rows) => rows.map((r) => ({ seq: r.dataset.seq, link: r.dataset.link, lease: r.dataset.lease, cls: r.className, text: r.textContent })));
const recoveryKind = (page) => page.$eval('[data-testid="recovery-kind"]', (p) => p.dataset.kind);

test("journal: a clean journal verifies, every link holds, one owner, recovery done", async () => {
  const page = await openJournalView();
  await sample(page, "verify_reference_journal");
  const v = await jverdict(page);
  assert.match(v.cls, /verified/);
  assert.match(v.text, /Verified: ended completed/);
  assert.match(v.text, /lease generation 1, next seq 15/);
  const rows = await chainRows(page);
  assert.equal(rows.length, 15);
  assert.deepEqual([...new Set(rows.map((r) => r.link))], ["ok"]);
  assert.match(rows[0].text, /genesis/);
  assert.deepEqual(await page.$$eval('[data-testid="lease"]', (l) => l.map((x) => x.dataset.generation)), ["1"]);
  assert.equal(await page.locator('[data-testid="reconciled-row"]').count(), 0);
  assert.equal(await recoveryKind(page), "done");
  await page.close();
});

test("journal: a broken chain is highlighted at its event with its code; recovery refuses", async () => {
  const page = await openJournalView();
  await sample(page, "verify_broken_chain");
  const v = await jverdict(page);
  assert.match(v.cls, /error/);
  assert.match(v.text, /journal_chain_broken/);
  assert.match(v.text, /\/events\/5\/prev_sha256/);
  const rows = await chainRows(page);
  const bad = rows.filter((r) => r.link === "broken");
  assert.deepEqual(bad.map((r) => r.seq), ["5"]);
  assert.match(bad[0].cls, /broken/);
  assert.match(bad[0].cls, /failed/);
  assert.match(await page.$eval('[data-testid="chain-error"]', (e) => e.textContent), /journal_chain_broken at \/events\/5\/prev_sha256/);
  assert.equal(await recoveryKind(page), "refused");
  assert.match(await page.$eval("#journal-recovery", (e) => e.textContent), /journal_chain_broken/);
  await page.screenshot({ path: path.join(shots, "journal-broken.png"), fullPage: true });
  await page.close();
});

test("journal: a takeover with a reconciled attempt shows both generations and the attempt", async () => {
  const page = await openJournalView();
  await sample(page, "verify_recovered_journal");
  const v = await jverdict(page);
  assert.match(v.cls, /verified/, v.text);
  assert.match(v.text, /lease generation 2/);
  const rows = await chainRows(page);
  assert.equal(rows.length, 15);
  assert.deepEqual([...new Set(rows.map((r) => r.link))], ["ok"]);
  assert.deepEqual(rows.filter((r) => r.lease === "takeover").map((r) => r.seq), ["12"]);
  const leases = await page.$$eval('[data-testid="lease"]', (l) => l.map((x) => [x.dataset.generation, x.textContent]));
  assert.deepEqual(leases.map((l) => l[0]), ["1", "2"]);
  assert.match(leases[0][1], /seq 0–11 \(12 events\), first owner/);
  assert.match(leases[1][1], /seq 12–14 \(3 events\), takeover/);
  const rec = await page.$$eval('[data-testid="reconciled-row"]', (r) => r.map((x) => [...x.children].map((c) => c.textContent)));
  assert.deepEqual(rec, [["12", "#3", "external-fallback", "succeeded", "success", "1,650 ms", "2,400 ms", "3,000", "generation 1", "generation 2"]]);
  assert.equal(await recoveryKind(page), "done");
  await page.screenshot({ path: path.join(shots, "journal-takeover.png"), fullPage: true });
  await page.close();
});

test("journal: a crash after a dispatch is in doubt and recovery asks the receiver; answers settle it", async () => {
  const page = await openJournalView();
  await sample(page, "recover_reference_prefix_12_after_dispatched");
  assert.match((await jverdict(page)).text, /Verified: open after dispatched/);
  assert.equal(await recoveryKind(page), "reconcile");
  assert.match(await page.$eval("#journal-recovery", (e) => e.textContent), /attempt #3 on external-fallback .*never resubmit/);
  assert.match(await page.$eval('[data-testid="in-doubt"]', (e) => e.textContent), /attempt #3 on external-fallback was dispatched at 1,650 ms/);

  await sample(page, "reconcile_in_progress_then_succeeded");
  assert.equal(await recoveryKind(page), "adopt");
  assert.match(await page.$eval("#journal-recovery", (e) => e.textContent), /reconciled: succeeded/);
  await page.close();
});

test("journal: a fenced owner's event and a gap in seq are coded at their event", async () => {
  const page = await openJournalView();
  await sample(page, "verify_lower_lease_generation");
  let v = await jverdict(page);
  assert.match(v.text, /journal_stale_lease/);
  const rows = await chainRows(page);
  assert.deepEqual(rows.filter((r) => r.lease === "stale").map((r) => r.seq), ["6"]);
  assert.match(await page.$eval("#journal-leases", (e) => e.textContent), /fenced owner/);
  await sample(page, "verify_seq_gap");
  v = await jverdict(page);
  assert.match(v.text, /journal_seq_gap/);
  assert.match(await page.$eval('[data-testid="chain-error"]', (e) => e.textContent), /\/events\/5\/seq/);
  await page.close();
});

test("journal: bad input gets coded errors, never a broken page", async () => {
  const page = await openJournalView();
  const tryText = async (text) => {
    await page.$eval("#journal-paste", (t, s) => (t.value = s), text);
    await page.click("#journal-open");
    return jverdict(page);
  };
  const vectors = JSON.parse(readFileSync(path.join(repo, "tests", "vectors", "journal.json"), "utf8")).cases;
  const ref = vectors.find((c) => c.name === "verify_reference_journal").input;
  const policy = JSON.parse(ref.policy);
  const events = JSON.parse(ref.events);

  assert.match((await tryText("")).text, /empty_input/);
  assert.match((await tryText("this is not json {")).text, /invalid_json/);
  assert.match((await tryText(JSON.stringify(events))).text, /invalid_type.*policy beside it/);
  assert.match((await tryText(JSON.stringify({ policy }))).text, /missing_field.*\/events/);
  assert.match((await tryText(JSON.stringify({ policy, events, extra: 1 }))).text, /unknown_field.*\/extra/);
  let v = await tryText(JSON.stringify({ policy, events: {} }));
  assert.match(v.text, /invalid_type/);
  assert.match(v.text, /\/events/);
  v = await tryText(JSON.stringify({ policy: {}, events }));
  assert.match(v.cls, /error/);
  assert.match(v.text, /missing_field|invalid/);
  v = await tryText(JSON.stringify({ policy, events: [...events.slice(0, 3), 42, ...events.slice(3)] }));
  assert.match(v.cls, /error/);
  assert.equal((await chainRows(page)).length, 16, "the chain is still drawn around an event that is not one");
  v = await tryText(JSON.stringify({ policy, events, reconciliation: { schema: "retryledger.reconciliation.v1", ordinal: 3, max_polls: 0, answers: [] } }));
  assert.match(v.cls, /verified/);
  assert.equal(await recoveryKind(page), "refused");
  // Journals may reach 32 MiB, like bundles; one byte more is refused before parsing.
  v = await tryText(JSON.stringify({ policy, events, pad: "x".repeat(32 * 1024 * 1024) }));
  assert.match(v.text, /input_too_large/);
  // The vectors' own input (each part as JSON text) opens as it is.
  v = await tryText(JSON.stringify({ policy: ref.policy, events: ref.events }));
  assert.match(v.cls, /verified/);
  assert.equal((await chainRows(page)).length, 15);
  // A file, as a file input gives it.
  await page.setInputFiles("#journal-file", { name: "journal.json", mimeType: "application/json", buffer: Buffer.from(JSON.stringify({ policy, events })) });
  await page.waitForFunction(() => document.getElementById("journal-verdict").textContent.includes("journal.json"));
  assert.match((await jverdict(page)).cls, /verified/);
  // And it still opens a good one.
  await sample(page, "verify_reference_journal");
  assert.match((await jverdict(page)).cls, /verified/);
  await page.close();
});

test("both views are labelled, reachable from the tabs, and fit a phone", async () => {
  const page = await openJournalView({ width: 390, height: 844 });
  await sample(page, "verify_recovered_journal");
  let overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 1, `journal view overflows by ${overflow}px`);
  await page.screenshot({ path: path.join(shots, "journal-phone.png"), fullPage: true });
  await page.click("#tab-fleet");
  await page.waitForFunction(() => document.getElementById("fleet-status").textContent.includes("Ready"), null, { timeout: 60_000 });
  assert.equal(await page.isHidden("#view-journal"), true);
  overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 1, `fleet view overflows by ${overflow}px`);
  const unlabelled = await page.$$eval("input, select, textarea", (els) => els.filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label")).map((e) => e.id));
  assert.deepEqual(unlabelled, []);
  await page.click("#tab-bundle");
  // The view changes on the hashchange event, which fires after the click returns.
  await page.waitForSelector("#view-bundle", { state: "visible", timeout: 10_000 });
  assert.equal(await page.isHidden("#view-fleet"), true);
  assert.equal(await page.getAttribute("#tab-bundle", "aria-current"), "page");
  await page.close();
});

test("no page errors and no request leaves the page's own server", async () => {
  assert.deepEqual(pageErrors, []);
  assert.deepEqual(offsite, []);
  for (const s of ["fleet-view.png", "journal-takeover.png", "journal-broken.png"]) assert.ok((await stat(path.join(shots, s))).size > 10_000, s);
});
