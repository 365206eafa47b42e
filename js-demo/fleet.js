// The fleet view: pick a shipped scenario (or edit it), run every strategy
// with the simulator module in a worker, and show the CLI's table and charts.
import { $, el, fmt, setBox, describeError } from "./dom.js";

/** Scenario text is at most this long (the simulator's own limit). */
const MAX_SCENARIO_BYTES = 1024 * 1024;

let worker = null;
let nextId = 0;
const waiting = new Map();
let scenarios = [];
let running = null;
let urls = [];

function startWorker() {
  worker = new Worker(new URL("./fleet-worker.js", import.meta.url), { type: "module" });
  worker.onmessage = (e) => {
    const { id } = e.data ?? {};
    const w = waiting.get(id);
    if (!w) return;
    waiting.delete(id);
    w(e.data);
  };
  // A worker that cannot load its module, or dies: every caller gets a coded
  // error, and the next request starts a fresh worker (never a restart loop).
  worker.onerror = (e) => {
    e.preventDefault();
    worker?.terminate();
    worker = null;
    failAll({ code: "internal", path: "", message: `the simulator stopped: ${e.message ?? "worker error"}` });
  };
}

function failAll(error) {
  for (const [id, w] of waiting) {
    waiting.delete(id);
    w({ id, error });
  }
}

function stopWorker() {
  worker?.terminate();
  worker = null;
}

function ask(message) {
  if (!worker) startWorker();
  const id = ++nextId;
  return new Promise((resolve) => {
    waiting.set(id, resolve);
    worker.postMessage({ id, ...message });
  });
}

const status = (kind, title, lines) => setBox($("fleet-status"), kind, title, lines);

/** The simulator's Markdown table as an HTML table, cell for cell. */
export function tableRows(markdown) {
  return markdown
    .split("\n")
    .filter((l) => l.startsWith("|") && !/^\|\s*-/.test(l))
    .map((l) =>
      l
        .slice(1, l.endsWith("|") ? -1 : undefined)
        .split("|")
        .map((c) => c.trim()),
    );
}

function renderTable(markdown) {
  const [head, ...rows] = tableRows(markdown);
  const table = $("fleet-table");
  const tr = el("tr");
  for (const h of head ?? []) tr.append(el("th", { scope: "col", text: h }));
  const body = el("tbody");
  for (const row of rows) {
    const r = el("tr", { "data-testid": "fleet-row" });
    row.forEach((c, i) => r.append(i === 0 ? el("th", { scope: "row", text: c }) : el("td", { text: c })));
    body.append(r);
  }
  table.replaceChildren(el("thead", {}, tr), body);
  $("fleet-markdown").textContent = markdown;
}

/** The SVG text the simulator wrote, shown as it is (its own bytes), scaled to the page. */
function renderChart(box, text, label) {
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const root = doc.documentElement;
  if (root.nodeName !== "svg") {
    box.replaceChildren(el("p", { text: `the ${label} chart did not parse` }));
    return;
  }
  root.setAttribute("role", "img");
  root.setAttribute("aria-label", label);
  root.removeAttribute("width");
  root.removeAttribute("height");
  box.replaceChildren(document.importNode(root, true));
}

function renderDownloads(run) {
  for (const u of urls) URL.revokeObjectURL(u);
  urls = [];
  const link = (text, name, type, label) => {
    const url = URL.createObjectURL(new Blob([text], { type }));
    urls.push(url);
    return el("a", { href: url, download: name, "data-testid": "fleet-download", text: label });
  };
  const stem = run.chart_stem;
  $("fleet-downloads").replaceChildren(
    document.createTextNode("Download: "),
    link(run.load_svg, `${stem}-load.svg`, "image/svg+xml", `${stem}-load.svg`),
    document.createTextNode(", "),
    link(run.latency_svg, `${stem}-latency.svg`, "image/svg+xml", `${stem}-latency.svg`),
    document.createTextNode(", "),
    link(`${JSON.stringify(run.figures, null, 2)}\n`, `${stem}.json`, "application/json", "figures JSON"),
  );
}

function selected() {
  return scenarios[Number($("fleet-scenario").value)];
}

/** Show a scenario's text and its editable parameters. */
function loadScenario(s) {
  $("fleet-json").value = s.text;
  try {
    const doc = JSON.parse(s.text);
    $("fleet-seed").value = String(s.text.match(/"seed"\s*:\s*(\d+)/)?.[1] ?? doc.seed ?? "");
    $("fleet-rate").value = String(doc.arrivals?.rate_per_s ?? "");
    $("fleet-duration").value = String(Math.round((doc.duration_ms ?? 0) / 1000));
  } catch {
    // The shipped scenarios parse; an edited one is the simulator's to judge.
  }
}

/** The scenario text with the rate and duration fields applied (when it parses as JSON). */
function scenarioText() {
  const text = $("fleet-json").value;
  const rate = $("fleet-rate").value.trim();
  const duration = $("fleet-duration").value.trim();
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {
    return text; // the simulator says invalid_json, with its code
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) return text;
  let changed = false;
  if (rate !== "" && doc.arrivals && typeof doc.arrivals === "object" && String(doc.arrivals.rate_per_s) !== rate) {
    doc.arrivals.rate_per_s = Number(rate);
    changed = true;
  }
  if (duration !== "" && typeof doc.duration_ms === "number" && String(Math.round(doc.duration_ms / 1000)) !== duration) {
    doc.duration_ms = Number(duration) * 1000;
    changed = true;
  }
  return changed ? JSON.stringify(doc, null, 2) : text;
}

export async function run() {
  if (running) return;
  const s = selected();
  const text = scenarioText();
  if (text.length > MAX_SCENARIO_BYTES) {
    status("error", "Too large", [describeError({ code: "input_too_large", message: `the scenario is ${fmt(text.length)} characters; at most ${fmt(MAX_SCENARIO_BYTES)} bytes` })]);
    return;
  }
  const seed = $("fleet-seed").value.trim();
  running = ask({ op: "simulate", name: s?.name ?? "scenario", text, seed: seed === "" ? undefined : seed });
  $("fleet-run").disabled = true;
  $("fleet-cancel").disabled = false;
  status("pending", `Running ${s?.name ?? "the scenario"}…`, ["Every strategy over the same seeded arrivals, in this page."]);
  const answer = await running;
  running = null;
  $("fleet-run").disabled = false;
  $("fleet-cancel").disabled = true;
  if (answer.error) {
    $("fleet-report").hidden = true;
    const title = answer.error.code === "cancelled" ? "Stopped" : "The scenario was not run";
    status("error", title, [describeError(answer.error)]);
    return;
  }
  const r = answer.ok;
  renderTable(r.table);
  renderChart($("fleet-load"), r.load_svg, `Offered load over time, ${r.scenario}`);
  renderChart($("fleet-latency"), r.latency_svg, `Latency CDF, ${r.scenario}`);
  renderDownloads(r);
  $("fleet-report").hidden = false;
  status("verified", `${r.scenario}: seed ${r.seed}, ${fmt(r.requests)} logical requests over ${fmt(r.duration_ms / 1000)} s`, [
    `${r.description}. Simulated in ${fmt(answer.ms)} ms; the same scenario and seed give the same table and charts as retryledger-sim ${r.scenario} --seed ${r.seed}.`,
  ]);
}

function cancel() {
  if (!running) return;
  stopWorker();
  failAll({ code: "cancelled", path: "", message: "the run was stopped; nothing was kept" });
}

export async function initFleet() {
  $("fleet-run").addEventListener("click", run);
  $("fleet-cancel").addEventListener("click", cancel);
  $("fleet-scenario").addEventListener("change", () => {
    const s = selected();
    if (s) loadScenario(s);
  });
  const answer = await ask({ op: "scenarios" });
  if (answer.error) {
    status("error", "The simulator did not load", [describeError(answer.error)]);
    return;
  }
  scenarios = answer.ok;
  const select = $("fleet-scenario");
  select.replaceChildren(...scenarios.map((s, i) => el("option", { value: String(i), text: `${s.name} — ${s.description}` })));
  select.disabled = false;
  $("fleet-run").disabled = false;
  loadScenario(scenarios[0]);
  status("pending", "Ready", ["Choose a scenario, change the seed or the traffic if you like, and run it."]);
}
