// The inspector: open a bundle, replay it with the core in the browser, and
// show the verdict, a timeline, budget meters, digests and the raw documents.
// Two more views: the fleet simulator (fleet.js) and run journals
// (journal.js). All rendering is plain DOM and SVG; no network beyond the
// page's own files.
import { loadCore } from "./core.js";
import { layoutTimeline } from "./timeline.js";
import { initFleet } from "./fleet.js";
import { initJournal, wireJournal, selectSample } from "./journal.js";
import { setBox } from "./dom.js";

const MAX_FILE_BYTES = 32 * 1024 * 1024;
const SVG_NS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

let core = null;
let cases = [];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

const fmt = (n) => Number(n).toLocaleString("en-US");

function setVerdict(kind, title, lines = []) {
  const box = $("verdict");
  box.className = `verdict ${kind}`;
  box.replaceChildren(el("strong", { text: title }), ...lines.map((l) => el("p", {}, l)));
}

function codeSpan(code) {
  return el("span", { class: "code", text: code });
}

function describeError(err) {
  const parts = [codeSpan(err.code ?? "error"), document.createTextNode(` — ${err.message}`)];
  if (err.path) parts.push(document.createTextNode(` (at ${err.path})`));
  const p = el("span");
  p.append(...parts);
  return p;
}

/** Verify JSON text and render everything it allows. */
function inspect(text, source) {
  $("report").hidden = true;
  if (typeof text !== "string" || text.trim() === "") {
    setVerdict("error", "Nothing to inspect", ["The input is empty. Open, drop or paste a retryledger bundle."]);
    return;
  }
  // Over the bundle limit, however it is counted: refused before parsing.
  if (text.length > MAX_FILE_BYTES) {
    const line = el("span");
    line.append(codeSpan("input_too_large"), document.createTextNode(` — ${source} is ${fmt(text.length)} characters; bundles are at most ${fmt(MAX_FILE_BYTES)} bytes.`));
    setVerdict("error", "Too large", [line]);
    return;
  }
  let doc = null;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    setVerdict("error", "Not JSON", [`${source} is not valid JSON: ${e.message}`]);
    return;
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    setVerdict("error", "Not a bundle", [`${source} is JSON but not an object; a bundle is {"schema": "retryledger.bundle.v1", …}.`]);
    return;
  }
  if (doc.schema !== "retryledger.bundle.v1") {
    const named = typeof doc.schema === "string" ? `"${doc.schema.slice(0, 80)}"` : "no schema";
    setVerdict("error", "Not a receipt bundle", [`${source} names ${named}; the inspector opens "retryledger.bundle.v1" documents.`]);
    return;
  }
  let verdict;
  try {
    verdict = core.verifyBundle(text);
  } catch (err) {
    const family = err.family ?? "decode";
    const title = family === "policy" ? "Policy rejected before any dispatch" : "The bundle does not decode";
    setVerdict("error", title, [describeError(err)]);
    if (family === "policy") render(doc, null);
    return;
  }
  if (verdict.kind === "verified") {
    setVerdict("verified", `Verified: ${verdict.terminal}`, [
      `The receipt is exactly the replay of the policy and ${doc.attempts.attempts.length} attempt(s). Source: ${source}.`,
    ]);
  } else {
    const where = verdict.attempt_index !== undefined ? `attempt ${verdict.attempt_index + 1} (index ${verdict.attempt_index}), ` : "";
    const line = el("span");
    line.append(codeSpan(verdict.code), document.createTextNode(` — ${where}field ${verdict.path}: ${verdict.message}`));
    setVerdict("drift", "Drift detected", [line]);
  }
  render(doc, verdict);
}

function render(bundle, verdict) {
  $("report").hidden = false;
  renderTimeline(bundle, verdict);
  renderMeters(bundle);
  renderDigests(bundle, verdict);
  renderDocuments(bundle);
}

function renderTimeline(bundle, verdict) {
  // Lay out at the container's own width so text stays readable on phones.
  const width = Math.max(360, Math.min(1400, $("timeline").clientWidth || 1100));
  const snapshots = new Map();
  for (const s of [...(bundle.fleet_snapshots?.breakers ?? []), ...(bundle.fleet_snapshots?.budgets ?? [])]) {
    try {
      snapshots.set(core.digest(JSON.stringify(s)), s);
    } catch {
      // A snapshot that does not decode has no digest: the verdict says why.
    }
  }
  const layout = layoutTimeline(bundle, { width, snapshots });
  const root = svg("svg", {
    viewBox: `0 0 ${layout.width} ${layout.height}`,
    role: "img",
    "aria-label": layout.summary,
    "data-testid": "timeline-svg",
  });
  root.append(svg("title", {}, layout.summary));
  for (const lane of layout.lanes) {
    const g = svg("g", { class: "lane", "data-testid": "route-lane", "data-route": lane.routeId });
    g.append(svg("rect", { x: 0, y: lane.y, width: layout.width, height: lane.height, fill: lane.index % 2 ? "#fafbfc" : "#ffffff" }));
    g.append(svg("text", { x: 6, y: lane.y + 14, class: "lane-label" }, `${lane.priority}: ${lane.routeId}`));
    root.append(g);
  }
  for (const tick of layout.ticks) {
    root.append(svg("line", { x1: tick.x, x2: tick.x, y1: layout.axisY - 4, y2: layout.axisY, stroke: "#8c959f" }));
    root.append(svg("text", { x: tick.x, y: layout.axisY + 12, "text-anchor": "middle" }, tick.label));
  }
  for (const band of layout.jitter) {
    root.append(svg("rect", { class: "jitter-band", x: band.x, y: band.y, width: band.width, height: band.height }, undefined));
  }
  for (const gap of layout.gaps) {
    root.append(svg("line", { class: "gap-line", x1: gap.x1, x2: gap.x2, y1: gap.y, y2: gap.y }));
    const m = svg("polygon", { class: "not-before", points: `${gap.x2},${gap.y - 5} ${gap.x2 + 4},${gap.y} ${gap.x2},${gap.y + 5} ${gap.x2 - 4},${gap.y}` });
    m.append(svg("title", {}, `not before ${fmt(gap.notBefore)} ms`));
    root.append(m);
  }
  for (const hint of layout.hints) {
    const line = svg("line", { class: "hint-line", x1: hint.x1, x2: hint.x2, y1: hint.y, y2: hint.y });
    line.append(svg("title", {}, hint.label));
    root.append(line);
    root.append(svg("text", { x: hint.x1, y: hint.y - 3 }, hint.label));
  }
  for (const link of layout.hedgeLinks) {
    const l = svg("line", { class: "hedge-link", x1: link.x, x2: link.x, y1: link.y1, y2: link.y2, "data-testid": "hedge-link", "data-ordinal": link.ordinal });
    l.append(svg("title", {}, link.label));
    root.append(l);
  }
  for (const bar of layout.bars) {
    const r = svg("rect", {
      class: `bar ${bar.outcomeClass}${bar.loss ? ` loser ${bar.loss}` : ""}`,
      x: bar.x,
      y: bar.y,
      width: bar.width,
      height: bar.height,
      rx: 2,
      "data-testid": "attempt-bar",
      "data-ordinal": bar.ordinal,
      ...(bar.loss ? { "data-loss": bar.loss } : {}),
      ...(bar.hedges !== undefined ? { "data-hedges": bar.hedges } : {}),
      ...(bar.job !== undefined ? { "data-job": bar.job } : {}),
    });
    r.append(svg("title", {}, bar.label));
    root.append(r);
    if (verdict && verdict.attempt_index === bar.ordinal - 1) {
      r.classList.add("drifted");
    }
    if (bar.width >= 22) root.append(svg("text", { x: bar.x + 4, y: bar.y + 12, class: "bar-label" }, `#${bar.ordinal}`));
  }
  if (layout.winner) {
    const w = layout.winner;
    const r = svg("rect", { class: "winner", x: w.x, y: w.y, width: w.width, height: w.height, rx: 3, "data-testid": "winner", "data-ordinal": w.ordinal });
    r.append(svg("title", {}, w.label));
    root.append(r);
  }
  for (const mark of layout.streamMarks) {
    const r = svg("rect", {
      class: `stream-mark ${mark.status}`,
      x: mark.x,
      y: mark.y,
      width: mark.width,
      height: mark.height,
      "data-testid": "stream-mark",
      "data-ordinal": mark.ordinal,
      "data-status": mark.status,
    });
    r.append(svg("title", {}, mark.label));
    root.append(r);
  }
  for (const adm of layout.admissions) {
    const badge = svg("circle", {
      class: `admission${adm.probe ? " probe" : ""}${adm.skipped ? " skipped" : ""}`,
      cx: adm.x + 4,
      cy: adm.y,
      r: 4,
      "data-testid": "admission",
      "data-ordinal": adm.ordinal,
    });
    badge.append(svg("title", {}, adm.label));
    root.append(badge);
  }
  if (layout.fleetStop) {
    const f = layout.fleetStop;
    root.append(svg("text", { x: 6, y: layout.axisY - 6, fill: "#cf222e", "data-testid": "fleet-stop" }, `fleet stop: ${f.reason.replace("_", " ")}${(f.skipped ?? []).length ? ` (skipped ${(f.skipped ?? []).map((k) => k.route_id).join(", ")})` : ""}`));
  }
  if (layout.deadline) {
    const d = layout.deadline;
    root.append(svg("line", { class: "deadline-line", x1: d.x, x2: d.x, y1: 0, y2: layout.axisY, "data-testid": "deadline" }));
    const label = d.offScale ? `deadline ${fmt(d.ms)} ms (off scale) →` : `deadline ${fmt(d.ms)} ms`;
    root.append(svg("text", { x: d.x - 4, y: 12, "text-anchor": "end", fill: "#cf222e" }, label));
  }
  $("timeline").replaceChildren(root);

  const table = el("table");
  const head = el("tr");
  const columns = ["#", "route", "route #", "outcome", "not before", "start", "end", "delay", "cost", ...(layout.jobs ? ["job"] : [])];
  for (const h of columns) head.append(el("th", { scope: "col", text: h }));
  table.append(el("thead", {}, head));
  const body = el("tbody");
  for (const row of layout.rows) {
    const tr = el("tr");
    for (const v of row) tr.append(el("td", { text: String(v) }));
    body.append(tr);
  }
  table.append(body);
  $("schedule-table").replaceChildren(table);
}

function meter(label, value, max, figure) {
  const id = `m-${label.replace(/\W+/g, "-")}`;
  const m = el("meter", { id, min: "0", max: String(Math.max(max, 1)), value: String(Math.min(value, Math.max(max, 1))), "data-testid": "meter" });
  if (value > max) m.setAttribute("high", String(max));
  return el("div", { class: "meter" }, el("label", { for: id, text: label }), m, el("span", { class: "figure", text: figure }));
}

function renderMeters(bundle) {
  const p = bundle.policy;
  const attempts = bundle.attempts.attempts;
  const box = $("meters");
  box.replaceChildren();
  box.append(meter("Attempts, all routes", attempts.length, p.max_total_attempts, `${attempts.length} of ${p.max_total_attempts}`));
  const routes = [...p.routes].sort((a, b) => a.priority - b.priority);
  for (const r of routes) {
    const used = attempts.filter((a) => a.route_id === r.route_id).length;
    box.append(meter(`Attempts on ${r.route_id}`, used, r.max_attempts, `${used} of ${r.max_attempts}`));
  }
  const spent = attempts.reduce((s, a) => s + a.cost, 0);
  const reserve = Object.fromEntries(p.routes.map((r) => [r.route_id, r.reserve_cost]));
  const reserved = attempts.reduce((s, a) => s + (reserve[a.route_id] ?? 0), 0);
  box.append(meter(`Cost spent (${p.cost_unit})`, spent, p.max_total_cost, `${fmt(spent)} of ${fmt(p.max_total_cost)}`));
  box.append(meter(`Cost reserved (${p.cost_unit})`, reserved, p.max_total_cost, `${fmt(reserved)} reserved before dispatch, max ${fmt(p.max_total_cost)}`));
  const finished = bundle.receipt?.finished_at_ms ?? attempts.reduce((m, a) => Math.max(m, a.completed_at_ms), 0);
  box.append(meter("Time used of the deadline", finished, p.deadline_ms, `${fmt(finished)} ms of ${fmt(p.deadline_ms)} ms`));
}

function copyButton(value, label) {
  const b = el("button", { type: "button", "aria-label": `Copy ${label}`, text: "Copy" });
  b.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(value);
      b.textContent = "Copied";
    } catch {
      const range = document.createRange();
      range.selectNodeContents(b.previousElementSibling);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      b.textContent = "Selected";
    }
    setTimeout(() => (b.textContent = "Copy"), 1500);
  });
  return b;
}

function safeDigest(doc) {
  try {
    return core.digest(JSON.stringify(doc));
  } catch (err) {
    return `(${err.code ?? "error"})`;
  }
}

function renderDigests(bundle, verdict) {
  const rows = [
    ["policy SHA-256", verdict?.policy_sha256 ?? safeDigest(bundle.policy)],
    ["attempts SHA-256", verdict?.attempts_sha256 ?? safeDigest(bundle.attempts)],
    ["receipt SHA-256", verdict?.receipt_sha256 ?? safeDigest(bundle.receipt)],
    ["bundle SHA-256", safeDigest(bundle)],
  ];
  const dl = $("digests");
  dl.replaceChildren();
  for (const [k, v] of rows) {
    dl.append(el("dt", { text: k }), el("dd", { "data-testid": "digest", text: v }), copyButton(v, k));
  }
}

function renderDocuments(bundle) {
  const box = $("documents");
  box.replaceChildren();
  for (const key of ["policy", "attempts", "receipt"]) {
    box.append(el("details", {}, el("summary", { text: `${key} (${bundle[key]?.schema ?? "?"})` }), el("pre", { text: JSON.stringify(bundle[key], null, 2) })));
  }
}

async function readFile(file) {
  if (file.size > MAX_FILE_BYTES) {
    setVerdict("error", "File too large", [`${file.name} is ${fmt(file.size)} bytes; bundles are at most 32 MiB.`]);
    return;
  }
  inspect(await file.text(), file.name);
}

function wire() {
  $("file-input").addEventListener("change", (e) => {
    const f = e.target.files?.[0];
    if (f) readFile(f);
  });
  const drop = $("drop-zone");
  drop.addEventListener("dragover", (e) => {
    e.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    const f = e.dataTransfer?.files?.[0];
    if (f) readFile(f);
    else inspect(e.dataTransfer?.getData("text/plain") ?? "", "dropped text");
  });
  drop.addEventListener("paste", (e) => inspect(e.clipboardData?.getData("text/plain") ?? "", "pasted text"));
  drop.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      $("file-input").click();
    }
  });
  $("paste-verify").addEventListener("click", () => inspect($("paste-input").value, "pasted text"));
  $("case-load").addEventListener("click", () => {
    const c = cases[Number($("case-select").value)];
    if (c) inspect(JSON.stringify(c.bundle), `lab case "${c.name}" (expects ${c.expected})`);
  });
}

async function loadCases() {
  const select = $("case-select");
  try {
    const res = await fetch("lab.json");
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const report = await res.json();
    cases = report.cases ?? [];
    select.replaceChildren(...cases.map((c, i) => el("option", { value: String(i), text: `${c.name} — expects ${c.expected}` })));
    select.disabled = false;
    $("case-load").disabled = false;
  } catch (e) {
    select.replaceChildren(el("option", { text: `lab cases unavailable (${e.message})` }));
  }
}

const VIEWS = ["bundle", "fleet", "journal"];
let fleetStarted = null;

/** Show one view (from the address's hash); the fleet's simulator loads on first use. */
function showView() {
  const name = VIEWS.includes(location.hash.slice(1)) ? location.hash.slice(1) : "bundle";
  for (const v of VIEWS) {
    $(`view-${v}`).hidden = v !== name;
    const tab = $(`tab-${v}`);
    if (v === name) tab.setAttribute("aria-current", "page");
    else tab.removeAttribute("aria-current");
  }
  if (name === "fleet" && !fleetStarted) fleetStarted = initFleet();
}

async function main() {
  wire();
  wireJournal();
  window.addEventListener("hashchange", showView);
  showView();
  try {
    core = await loadCore();
  } catch (e) {
    setVerdict("error", "The core did not load", [String(e?.message ?? e)]);
    setBox($("journal-verdict"), "error", "The core did not load", [String(e?.message ?? e)]);
    return;
  }
  await initJournal(core);
  setVerdict("pending", "Ready", ["Choose a lab case, open a file, drop one here, or paste JSON."]);
  await loadCases();
  const params = new URLSearchParams(location.search);
  if (params.has("journal")) selectSample(params.get("journal"));
  if (params.has("case")) {
    const i = cases.findIndex((c) => c.name === params.get("case"));
    if (i >= 0) {
      $("case-select").value = String(i);
      $("case-load").click();
    }
  }
}

main();
