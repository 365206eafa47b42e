// Timeline layout for a bundle: pure data, no DOM, so it can be tested in
// Node and drawn by app.js. One lane per route in priority order; one bar per
// attempt from start to completion; backoff gaps ending at not_before;
// Retry-After floors; jitter intervals; the deadline; for a streamed run, a
// mark under each attempt that delivered events, saying whether they were
// committed, invalidated or are still pending; under a fleet section, what
// each attempt was admitted under (breaker state and generation, probe,
// budget balance, routes skipped) and the fleet's stop; for a hedged run,
// overlapping attempts (an attempt that overlaps another on its lane moves to
// a second row), a link from each lead to its hedge at the hedge's
// threshold, the losers (cancelled or late) and the winner marked; for an
// async job, what each attempt was of the job (the submit, poll n, the
// cancel) and the status it saw, and the receipt's job summary.

const LANE_HEIGHT = 56;
const TOP = 24;
const AXIS = 28;
const LEFT = 12;
const RIGHT = 16;

function niceStep(span, target) {
  const raw = span / Math.max(target, 1);
  const pow = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  for (const m of [1, 2, 2.5, 5, 10]) if (raw <= m * pow) return m * pow;
  return 10 * pow;
}

const fmt = (n) => Number(n).toLocaleString("en-US");

/** What an attempt was of an async job: `submit`, `poll 3`, `cancel`, with the status its answer reported. */
export function jobStepText(job) {
  if (!job) return "";
  const step = job.kind === "poll" ? `poll ${job.poll ?? "?"}` : job.kind;
  return job.status === undefined ? step : `${step}: ${job.status.replace("_", " ")}`;
}

/** The receipt's job summary in words. */
function jobSummaryText(job) {
  const cancel = job.cancel === undefined ? "" : `, cancel ${job.cancel}`;
  const left = job.left_running ? ", left running" : "";
  const status = job.status === undefined ? "" : `, last status ${job.status.replace("_", " ")}`;
  return ` Job: ${job.submits} submit(s), ${job.polls} poll(s)${status}${cancel}${left}.`;
}

/**
 * @param {object} bundle a decoded retryledger.bundle.v1 document
 * @param {{width?: number, snapshots?: Map<string, object>}} opts
 *   `snapshots`: the bundle's fleet snapshots by their digest (the page
 *   computes them with the core's `digest`)
 */
export function layoutTimeline(bundle, opts = {}) {
  const width = opts.width ?? 1100;
  const policy = bundle.policy ?? {};
  const attempts = bundle.attempts?.attempts ?? [];
  const schedule = bundle.receipt?.schedule ?? [];
  const routes = [...(policy.routes ?? [])].sort((a, b) => a.priority - b.priority);
  const cap = policy.backoff?.retry_after_cap_ms ?? 0;
  const deadlineMs = policy.deadline_ms ?? 0;

  const events = [0];
  for (const a of attempts) events.push(a.started_at_ms, a.completed_at_ms);
  for (const s of schedule) events.push(s.not_before_ms, s.jitter_max_ms ?? 0);
  const last = Math.max(...events, 1);
  // A deadline far beyond the run would squash it: past 4x the last event it
  // is drawn at the right edge and labelled off scale.
  const onScale = deadlineMs <= last * 4;
  const domain = Math.max(last, onScale ? deadlineMs : 0) * 1.06;
  const x = (t) => LEFT + (t / domain) * (width - LEFT - RIGHT);

  const lanes = routes.map((r, i) => ({ index: i, routeId: r.route_id, priority: r.priority, y: TOP + i * LANE_HEIGHT, height: LANE_HEIGHT }));
  const laneOf = (routeId) => lanes.find((l) => l.routeId === routeId) ?? null;
  const axisY = TOP + lanes.length * LANE_HEIGHT + 4;

  // An async job's runs get a column saying what each attempt was of the job.
  const jobs = policy.async_job !== undefined;
  const bars = [];
  const hedgeLinks = [];
  const gaps = [];
  const hints = [];
  const jitter = [];
  const rows = [];
  attempts.forEach((a, i) => {
    const lane = laneOf(a.route_id);
    const entry = schedule.find((s) => s.ordinal === a.ordinal) ?? null;
    const cls = a.outcome?.class ?? "indeterminate";
    const kind = a.outcome?.kind ?? "success";
    // An attempt that overlaps an earlier one on its lane (a hedge on the same route) takes a second row.
    const overlaps = attempts
      .slice(0, i)
      .some((o) => o.route_id === a.route_id && o.started_at_ms < a.completed_at_ms && a.started_at_ms < o.completed_at_ms);
    const y = lane ? lane.y + (overlaps ? 38 : 22) : axisY - 18;
    const x1 = x(a.started_at_ms);
    const hedges = a.hedge?.hedges_ordinal;
    const loss = a.hedge?.loss;
    const role =
      (hedges !== undefined ? `, hedges attempt ${hedges}` : "") +
      (loss === "cancelled" ? ", lost: cancelled" : loss === "late" ? ", lost: answered late, kept and never adopted" : "");
    const bar = {
      ordinal: a.ordinal,
      routeId: a.route_id,
      outcomeClass: cls,
      hedges,
      loss,
      x: x1,
      y,
      width: Math.max(3, x(a.completed_at_ms) - x1),
      height: 16,
      job: a.job?.kind,
      label: `attempt ${a.ordinal} on ${a.route_id} (route attempt ${a.route_ordinal})${a.job ? `, job ${jobStepText(a.job)}` : ""}: ${kind}, ${fmt(a.started_at_ms)}–${fmt(a.completed_at_ms)} ms, cost ${fmt(a.cost)}${role}`,
    };
    bars.push(bar);
    if (hedges !== undefined) {
      const leadBar = bars.find((b) => b.ordinal === hedges);
      const lead = attempts.find((o) => o.ordinal === hedges);
      const k = attempts.filter((o) => o.hedge?.hedges_ordinal === hedges && o.ordinal <= a.ordinal).length;
      const threshold = (lead?.started_at_ms ?? 0) + k * (policy.hedge?.delay_ms ?? 0);
      if (leadBar) {
        hedgeLinks.push({
          ordinal: a.ordinal,
          lead: hedges,
          x: x(threshold),
          y1: leadBar.y + leadBar.height / 2,
          y2: bar.y + bar.height / 2,
          label: `hedge ${k} of attempt ${hedges}: threshold ${fmt(threshold)} ms, started ${fmt(a.started_at_ms)} ms`,
        });
      }
    }
    const prev = i > 0 ? attempts[i - 1] : null;
    if (prev && entry && hedges === undefined) {
      gaps.push({ x1: x(prev.completed_at_ms), x2: x(entry.not_before_ms), y: y + 8, notBefore: entry.not_before_ms });
      const hint = prev.outcome?.retry_after_ms;
      if (hint !== undefined) {
        const bounded = Math.min(hint, cap);
        hints.push({
          x1: x(prev.completed_at_ms),
          x2: x(prev.completed_at_ms + bounded),
          y: y + 24,
          label: bounded < hint ? `Retry-After ${fmt(hint)} ms, capped at ${fmt(bounded)} ms` : `Retry-After ${fmt(hint)} ms`,
        });
      }
      if (entry.jitter_min_ms !== undefined && entry.jitter_max_ms !== undefined) {
        const j1 = x(prev.completed_at_ms + entry.jitter_min_ms);
        jitter.push({ x: j1, y: lane ? lane.y + 2 : y, width: Math.max(2, x(prev.completed_at_ms + entry.jitter_max_ms) - j1), height: LANE_HEIGHT - 4 });
      }
    }
    const row = [a.ordinal, a.route_id, a.route_ordinal, kind, entry ? fmt(entry.not_before_ms) : "?", fmt(a.started_at_ms), fmt(a.completed_at_ms), entry ? fmt(entry.delay_ms) : "?", fmt(a.cost)];
    if (jobs) row.push(jobStepText(a.job) || "–");
    rows.push(row);
  });

  const streamMarks = streamMarksOf(bundle, bars);
  const admissions = admissionsOf(bundle, bars, opts.snapshots ?? new Map());

  const step = niceStep(domain, Math.max(2, Math.floor(width / 110)));
  const ticks = [];
  for (let t = 0; t <= domain; t += step) ticks.push({ x: x(t), label: `${fmt(t)} ms` });

  const terminal = bundle.receipt?.terminal ?? "unknown";
  const hedging = bundle.receipt?.hedge;
  const winnerBar = hedging?.winner_ordinal === undefined ? null : bars.find((b) => b.ordinal === hedging.winner_ordinal) ?? null;
  const winner = winnerBar
    ? { ordinal: winnerBar.ordinal, x: winnerBar.x - 2, y: winnerBar.y - 2, width: winnerBar.width + 4, height: winnerBar.height + 4, label: `winner: attempt ${winnerBar.ordinal} committed` }
    : null;
  const hedged = hedging
    ? ` Hedged: ${hedging.hedges} hedge(s)${winner ? `, winner attempt ${winner.ordinal}` : ""}, ${hedging.losers.length} loser(s) costing ${fmt(hedging.loser_cost)}.`
    : "";
  const job = bundle.receipt?.job;
  const summary = `${attempts.length} attempt(s) on ${lanes.length} route(s), ending ${terminal}; deadline ${fmt(deadlineMs)} ms.${hedged}${job ? jobSummaryText(job) : ""}`;
  return {
    width,
    height: axisY + AXIS,
    axisY,
    lanes,
    bars,
    hedgeLinks,
    winner,
    gaps,
    hints,
    jitter,
    streamMarks,
    admissions,
    fleetStop: bundle.attempts?.fleet_stop ?? null,
    ticks,
    rows,
    jobs,
    summary,
    deadline: { x: onScale ? x(deadlineMs) : width - RIGHT, ms: deadlineMs, offScale: !onScale },
  };
}

/**
 * Per attempt of a streamed run: the deltas the consumer received, and
 * whether the event that closed them was a commit or an invalidate (read
 * from the bundle's stream event log, in order).
 */
function streamMarksOf(bundle, bars) {
  const events = bundle.stream_events ?? [];
  const per = new Map();
  let pending = [];
  for (const e of events) {
    if (e.kind === "delta") {
      const m = per.get(e.attempt_ordinal) ?? { delivered: 0, status: "pending", sequences: [] };
      m.delivered += 1;
      m.sequences.push(e.sequence);
      per.set(e.attempt_ordinal, m);
      if (!pending.includes(e.attempt_ordinal)) pending.push(e.attempt_ordinal);
    } else {
      const status = e.kind === "commit" ? "committed" : "invalidated";
      for (const o of pending) per.get(o).status = status;
      pending = [];
    }
  }
  const marks = [];
  for (const bar of bars) {
    const m = per.get(bar.ordinal);
    if (!m) continue;
    const first = m.sequences[0];
    const last = m.sequences[m.sequences.length - 1];
    marks.push({
      ordinal: bar.ordinal,
      status: m.status,
      delivered: m.delivered,
      x: bar.x,
      y: bar.y + bar.height + 2,
      width: bar.width,
      height: 4,
      label: `attempt ${bar.ordinal}: ${m.delivered} event(s) delivered (sequence ${first}–${last}), ${m.status}`,
    });
  }
  return marks;
}

/**
 * Per admitted attempt: the breaker and budget snapshots it was admitted
 * under (found by digest), as a badge above its bar.
 */
function admissionsOf(bundle, bars, snapshots) {
  const attempts = bundle.attempts?.attempts ?? [];
  const out = [];
  for (const bar of bars) {
    const a = attempts.find((x) => x.ordinal === bar.ordinal);
    const adm = a?.admission;
    if (!adm) continue;
    const parts = [];
    if (adm.store === "unavailable") parts.push("admitted without the store (fail open)");
    if (adm.breaker) {
      const s = snapshots.get(adm.breaker.snapshot_sha256);
      const state = s ? s.state : "?";
      parts.push(`breaker ${state}, generation ${adm.breaker.generation}${adm.breaker.probe ? ", half-open probe" : ""}`);
    }
    if (adm.budget) {
      const s = snapshots.get(adm.budget.snapshot_sha256);
      const balance = s ? `${(s.balance_milli / 1000).toFixed(3)} tokens` : "?";
      parts.push(`budget ${adm.budget.kind} (balance ${balance})`);
    }
    const skipped = adm.skipped ?? [];
    if (skipped.length > 0) parts.push(`skipped ${skipped.map((k) => k.route_id).join(", ")} (breaker open)`);
    out.push({
      ordinal: bar.ordinal,
      probe: adm.breaker?.probe === true,
      skipped: skipped.length,
      x: bar.x,
      y: bar.y - 6,
      label: `attempt ${bar.ordinal} admitted under: ${parts.join("; ")}`,
    });
  }
  return out;
}
