// The journal view: open a run journal (the policy and its events, as
// journalVerify takes them), verify it with the core, and show its chain,
// its lease generations, its reconciled attempts and what recovery would do.
import { $, el, fmt, setBox, describeError, codeSpan } from "./dom.js";
import { analyseJournal, short, GENESIS } from "./chain.js";

/** The same limit as a bundle's: a journal file is at most 32 MiB. */
const MAX_JOURNAL_BYTES = 32 * 1024 * 1024;
const FIELDS = new Set(["policy", "events", "reconciliation"]);

let core = null;
let samples = [];

const verdict = (kind, title, lines) => setBox($("journal-verdict"), kind, title, lines);

function refuse(title, error) {
  $("journal-report").hidden = true;
  verdict("error", title, [describeError(error)]);
}

/** Core call that answers {ok} or {error} and never throws. */
function attempt(fn) {
  try {
    return { ok: fn() };
  } catch (err) {
    return { error: { code: err.code ?? "internal", path: err.path ?? "", message: err.message ?? String(err) } };
  }
}

/** Open JSON text from a sample, a file or the paste box. */
export function openJournal(text, source) {
  if (!core) return;
  if (typeof text !== "string" || text.trim() === "") {
    refuse("Nothing to open", { code: "empty_input", message: "the input is empty; open a sample, a file or paste a journal" });
    return;
  }
  if (text.length > MAX_JOURNAL_BYTES) {
    refuse("Too large", { code: "input_too_large", message: `${source} is ${fmt(text.length)} characters; journals are at most ${fmt(MAX_JOURNAL_BYTES)} bytes` });
    return;
  }
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    refuse("Not JSON", { code: "invalid_json", message: `${source} is not valid JSON: ${e.message}` });
    return;
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    const hint = Array.isArray(doc) ? "; a bare array of events needs its policy beside it" : "";
    refuse("Not a journal file", { code: "invalid_type", path: "", message: `a journal file is {"policy": …, "events": […]}${hint}` });
    return;
  }
  for (const k of Object.keys(doc)) {
    if (!FIELDS.has(k)) {
      refuse("Not a journal file", { code: "unknown_field", path: `/${k}`, message: `\`${k.slice(0, 80)}\`: a journal file holds policy, events and optionally reconciliation` });
      return;
    }
  }
  for (const k of ["policy", "events"]) {
    if (!(k in doc)) {
      refuse("Not a journal file", { code: "missing_field", path: `/${k}`, message: `a journal file needs \`${k}\`` });
      return;
    }
  }
  // Each part is a document or its JSON text (as the vectors hold them); text goes to the core as it is.
  const asText = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  const policy = asText(doc.policy);
  const events = asText(doc.events);
  const reconciliation = doc.reconciliation === undefined ? undefined : asText(doc.reconciliation);
  const verified = attempt(() => core.journalVerify(policy, events));
  const recovery = attempt(() => core.journalRecover(policy, events, reconciliation));
  let parsedEvents = doc.events;
  if (typeof parsedEvents === "string") {
    try {
      parsedEvents = JSON.parse(parsedEvents);
    } catch {
      parsedEvents = null; // the core's verdict says why
    }
  }
  const list = Array.isArray(parsedEvents) ? parsedEvents : [];
  const reconciliationDoc = attempt(() => (typeof doc.reconciliation === "string" ? JSON.parse(doc.reconciliation) : doc.reconciliation)).ok;
  const digests = list.map((e) => attempt(() => core.digest(JSON.stringify(e))).ok ?? null);
  const layout = analyseJournal(list, digests, verified.error ?? null);

  if (verified.ok) {
    const v = verified.ok;
    const end = v.terminal ? `ended ${v.terminal}` : `open after ${v.last_kind ?? "nothing"}`;
    verdict("verified", `Verified: ${end}`, [
      `${v.run_id ? `Run ${v.run_id}: ` : ""}${fmt(list.length)} event(s), ${v.attempts} attempt(s), lease generation ${v.lease_generation}, next seq ${v.next_seq}, head ${short(v.head_sha256)}. Source: ${source}.`,
    ]);
  } else {
    const where = layout.rows.find((r) => r.error);
    const line = describeError(verified.error);
    verdict("error", "The journal does not verify", [
      line,
      where ? `At seq ${where.seq ?? "?"} (event ${where.index}, ${where.kind ?? "?"}). Recovery refuses to act on an unverified journal.` : "Recovery refuses to act on an unverified journal.",
    ]);
  }
  $("journal-report").hidden = false;
  renderRecovery(recovery, reconciliationDoc);
  renderChain(layout);
  renderLeases(layout);
  renderReconciled(layout);
}

function recoveryLines(r) {
  switch (r.kind) {
    case "done":
      return [`Done: the run ended ${r.terminal}; receipt ${short(r.receipt_sha256)}. Nothing to do.`];
    case "resume": {
      const d = r.dispatch ? ` The reserved attempt #${r.dispatch.ordinal} on ${r.dispatch.route_id} was never sent: sending it is not a resubmission.` : "";
      return [`Resume: append \`${r.next}\` at seq ${r.next_seq}.${d}`];
    }
    case "reconcile":
      return [
        `Reconcile: attempt #${r.attempt.ordinal} on ${r.attempt.route_id} was sent at ${fmt(r.attempt.started_at_ms)} ms and never observed. Ask the receiver by idempotency key ${short(r.attempt.idempotency_key_sha256)}, no earlier than ${fmt(r.not_before_ms)} ms (poll ${r.poll}${r.max_polls ? ` of ${r.max_polls}` : ""}); never resubmit it.`,
      ];
    case "adopt":
      return [
        `Adopt: the receiver's answers settled attempt #${r.attempt.ordinal} as ${r.attempt.outcome?.class}${r.attempt.outcome?.kind ? ` (${r.attempt.outcome.kind})` : ""}, reconciled: ${r.attempt.reconciled}, at ${fmt(r.attempt.completed_at_ms)} ms, cost ${fmt(r.attempt.cost)}. Append it as \`observed\`, then the decision: ${r.decision?.kind === "terminal" ? r.decision.terminal : `dispatch #${r.decision?.ordinal} on ${r.decision?.route_id}`}.`,
      ];
    default:
      return [`${r.kind}`];
  }
}

function renderRecovery(recovery, reconciliation) {
  const box = $("journal-recovery");
  box.replaceChildren();
  if (recovery.error) {
    box.append(el("p", { class: "refused", "data-testid": "recovery-kind", "data-kind": "refused" }, el("strong", { text: "Refused: " }), describeError(recovery.error)));
    return;
  }
  const r = recovery.ok;
  box.append(el("p", { "data-testid": "recovery-kind", "data-kind": r.kind }, el("strong", { class: `recovery ${r.kind}`, text: r.kind }), document.createTextNode(" — "), ...recoveryLines(r)));
  if (Array.isArray(reconciliation?.answers)) {
    const ul = el("ul", { class: "answers" });
    for (const a of reconciliation.answers) ul.append(el("li", { text: `${fmt(a.at_ms)} ms: ${a.answer}${a.cost !== undefined ? `, cost ${fmt(a.cost)}` : ""}` }));
    box.append(el("p", { text: `The receiver's answers so far (attempt #${reconciliation.ordinal}, at most ${reconciliation.max_polls} polls):` }), ul);
  }
  box.append(el("details", {}, el("summary", { text: "The answer as JSON" }), el("pre", { text: JSON.stringify(r, null, 2) })));
}

function genClass(g) {
  return typeof g === "number" ? `gen-${g % 6}` : "gen-x";
}

function renderChain(layout) {
  // A strip of the events in order, coloured by lease generation, with the links between them.
  const strip = $("journal-strip");
  strip.replaceChildren();
  for (const r of layout.rows) {
    if (r.index > 0) {
      const ok = r.link === "ok";
      strip.append(el("span", { class: `link ${ok ? "ok" : "bad"}`, title: ok ? "prev_sha256 is the digest of the event before" : `link ${r.link}`, "aria-hidden": "true", text: ok ? "→" : "✗" }));
    }
    strip.append(
      el("span", {
        class: `event ${genClass(r.generation)}${r.error ? " failed" : ""}${r.lease === "takeover" ? " takeover" : ""}`,
        title: `seq ${r.seq} ${r.kind}, generation ${r.generation}`,
        text: `${r.seq ?? "?"}`,
      }),
    );
  }

  const table = $("journal-chain");
  const head = el("tr");
  for (const h of ["seq", "kind", "lease", "prev_sha256", "", "sha256", "event"]) head.append(el("th", { scope: "col", text: h }));
  const body = el("tbody");
  for (const r of layout.rows) {
    const tr = el("tr", {
      "data-testid": "chain-row",
      "data-seq": String(r.seq),
      "data-link": r.link,
      "data-lease": r.lease,
      class: [r.link === "broken" ? "broken" : "", r.error ? "failed" : "", r.lease === "stale" ? "stale" : ""].filter(Boolean).join(" ") || undefined,
    });
    const prev = r.prev === GENESIS ? "genesis (64 zeros)" : short(r.prev);
    const linkCell = el("td", { class: `link ${r.link}`, title: r.link === "broken" ? `expected ${r.expected}` : "" });
    linkCell.textContent = r.link === "ok" ? "✓" : r.link === "broken" ? "✗ broken" : r.link;
    const detail = el("td", { class: "detail" }, document.createTextNode(r.detail));
    if (r.error) {
      const mark = el("span", { class: "row-error", "data-testid": "chain-error" });
      mark.append(codeSpan(r.error.code), document.createTextNode(` at ${r.error.path}`));
      detail.append(el("br"), mark);
    }
    tr.append(
      el("td", { text: String(r.seq ?? "?") }),
      el("td", { text: String(r.kind ?? "?") }),
      el("td", {}, el("span", { class: `badge ${genClass(r.generation)}`, text: String(r.generation ?? "?") }), document.createTextNode(r.lease === "takeover" ? " takeover" : r.lease === "stale" ? " fenced" : "")),
      el("td", { class: "hash", title: r.prev ?? "", text: prev }),
      linkCell,
      el("td", { class: "hash", title: r.sha ?? "", text: short(r.sha) }),
      detail,
    );
    body.append(tr);
  }
  table.replaceChildren(el("thead", {}, head), body);
}

function renderLeases(layout) {
  const box = $("journal-leases");
  if (layout.generations.length === 0) {
    box.replaceChildren(el("p", { text: "No events." }));
    return;
  }
  const ol = el("ol", { class: "leases" });
  layout.generations.forEach((g, i) => {
    let what = i === 0 ? "first owner" : "takeover";
    if (g.lease === "stale") what = "lower than the generation before it: a fenced owner's events (journal_stale_lease)";
    const li = el("li", { "data-testid": "lease", "data-generation": String(g.generation), class: g.lease === "stale" ? "stale" : undefined });
    li.append(el("span", { class: `badge ${genClass(g.generation)}`, text: `generation ${g.generation}` }), document.createTextNode(` — seq ${g.fromSeq}${g.toSeq !== g.fromSeq ? `–${g.toSeq}` : ""} (${g.count} event${g.count === 1 ? "" : "s"}), ${what}`));
    ol.append(li);
  });
  box.replaceChildren(ol);
}

function renderReconciled(layout) {
  const box = $("journal-reconciled");
  box.replaceChildren();
  if (layout.reconciled.length === 0 && layout.inDoubt.length === 0) {
    box.append(el("p", { text: "None: every attempt's outcome was observed by the owner that sent it." }));
    return;
  }
  if (layout.reconciled.length) {
    const table = el("table", { class: "reconciled" });
    const head = el("tr");
    for (const h of ["seq", "attempt", "route", "reconciled", "outcome", "started", "completed", "cost", "sent under", "settled under"]) head.append(el("th", { scope: "col", text: h }));
    const body = el("tbody");
    for (const a of layout.reconciled) {
      const tr = el("tr", { "data-testid": "reconciled-row" });
      for (const v of [a.seq, `#${a.ordinal}`, a.routeId, a.reconciled, a.outcome, `${fmt(a.startedAt)} ms`, `${fmt(a.completedAt)} ms`, fmt(a.cost), `generation ${a.sentUnder ?? "?"}`, `generation ${a.settledUnder}`]) tr.append(el("td", { text: String(v) }));
      body.append(tr);
    }
    table.append(el("thead", {}, head), body);
    box.append(el("div", { class: "table-wrap" }, table));
  }
  for (const d of layout.inDoubt) {
    box.append(el("p", { class: "in-doubt", "data-testid": "in-doubt" }, el("strong", { text: "In doubt: " }), document.createTextNode(`attempt #${d.ordinal} on ${d.routeId} was dispatched at ${fmt(d.startedAt)} ms (seq ${d.seq}, generation ${d.generation}) and never observed; only the receiver knows whether it took effect.`)));
  }
}

async function readFile(file) {
  if (file.size > MAX_JOURNAL_BYTES) {
    refuse("File too large", { code: "input_too_large", message: `${file.name} is ${fmt(file.size)} bytes; journals are at most 32 MiB` });
    return;
  }
  openJournal(await file.text(), file.name);
}

function openSample() {
  const s = samples[Number($("journal-sample").value)];
  if (s) openJournal(JSON.stringify(s.journal), `sample "${s.name}" (tests/vectors/journal.json)`);
}

export function wireJournal() {
  $("journal-file").addEventListener("change", (e) => {
    const f = e.target.files?.[0];
    if (f) readFile(f);
  });
  $("journal-open").addEventListener("click", () => openJournal($("journal-paste").value, "pasted text"));
  $("journal-sample-load").addEventListener("click", openSample);
}

export async function initJournal(theCore) {
  core = theCore;
  verdict("pending", "Ready", ["Open a sample, a file, or paste a journal file."]);
  const select = $("journal-sample");
  try {
    const res = await fetch("journals.json");
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    samples = (await res.json()).samples ?? [];
    const expects = (e) => (e?.error ? e.error.code : e?.ok?.kind ?? (e?.ok ? "verified" : "?"));
    select.replaceChildren(...samples.map((s, i) => el("option", { value: String(i), "data-name": s.name, text: `${s.title} — expects ${expects(s.expect)}` })));
    select.disabled = false;
    $("journal-sample-load").disabled = false;
  } catch (e) {
    select.replaceChildren(el("option", { text: `samples unavailable (${e.message})` }));
  }
}

export function selectSample(name) {
  const i = samples.findIndex((s) => s.name === name);
  if (i < 0) return false;
  $("journal-sample").value = String(i);
  openSample();
  return true;
}
