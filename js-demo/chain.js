// The journal view's reading of a journal, without a browser: each event's
// chain link (its prev_sha256 against the digest of the event before it),
// the lease generations in turn (takeovers, fenced events), the reconciled
// attempts and the attempts still in doubt. Digests come from the core; the
// verdict is the core's (journalVerify); this only lays the events out.

export const GENESIS = "0".repeat(64);

const short = (h) => (typeof h === "string" && h.length > 12 ? `${h.slice(0, 8)}…${h.slice(-4)}` : String(h ?? "—"));
export { short };

function outcomeText(o) {
  if (!o || typeof o !== "object") return "?";
  return o.kind ? `${o.class} (${o.kind})` : String(o.class);
}

/** One line about what an event holds. */
export function describeEvent(e) {
  if (!e || typeof e !== "object") return "not an object";
  switch (e.kind) {
    case "created":
      return `run ${e.run_id} under policy ${short(e.policy_sha256)}`;
    case "decided": {
      const d = e.decision ?? {};
      if (d.kind === "dispatch") return `dispatch #${d.ordinal} on ${d.route_id} not before ${d.not_before_ms} ms`;
      if (d.kind === "terminal") return `terminal: ${d.terminal}`;
      return "decision ?";
    }
    case "reserved": {
      const d = e.dispatch ?? {};
      return `reserve #${d.ordinal} on ${d.route_id}, ${d.reserve_cost} reserved`;
    }
    case "dispatched":
      return `send #${e.ordinal} on ${e.route_id} at ${e.started_at_ms} ms (key ${short(e.idempotency_key_sha256)})`;
    case "observed": {
      const a = e.attempt ?? {};
      const rec = a.reconciled ? `, reconciled: ${a.reconciled}` : "";
      return `#${a.ordinal} on ${a.route_id}: ${outcomeText(a.outcome)}, ${a.started_at_ms}–${a.completed_at_ms} ms, cost ${a.cost}${rec}`;
    }
    case "terminal":
      return `${e.terminal}${e.cancelled_at_ms !== undefined ? ` (cancelled at ${e.cancelled_at_ms} ms)` : ""}${e.fleet_stop ? " (fleet stop)" : ""}, receipt ${short(e.receipt_sha256)}`;
    default:
      return `unknown kind ${JSON.stringify(e.kind)}`;
  }
}

/** The event index a JSON Pointer like `/events/5/prev_sha256` names, or null. */
export function eventIndex(path) {
  const m = /^\/events\/(\d+)(?:\/|$)/.exec(path ?? "");
  return m ? Number(m[1]) : null;
}

/**
 * Lay a journal out. `digests[i]` is the core's digest of event i (or null
 * when it has none); `error` is the verification's error (code, path) or null.
 */
export function analyseJournal(events, digests, error = null) {
  const failedAt = error ? eventIndex(error.path) : null;
  const rows = events.map((e, i) => {
    const prev = e?.prev_sha256;
    const expected = i === 0 ? GENESIS : digests[i - 1];
    let link = "ok";
    if (typeof prev !== "string") link = "missing";
    else if (expected === null || expected === undefined) link = "unknown";
    else if (prev !== expected) link = "broken";
    const gen = e?.lease_generation;
    const before = i > 0 ? events[i - 1]?.lease_generation : undefined;
    let lease = "same";
    if (i === 0) lease = "first";
    else if (typeof gen === "number" && typeof before === "number" && gen > before) lease = "takeover";
    else if (typeof gen === "number" && typeof before === "number" && gen < before) lease = "stale";
    return {
      index: i,
      seq: e?.seq,
      kind: e?.kind,
      generation: gen,
      lease,
      prev,
      expected,
      sha: digests[i] ?? null,
      link,
      detail: describeEvent(e),
      error: failedAt === i ? error : null,
    };
  });

  // Lease generations in turn: consecutive events under one generation.
  const generations = [];
  for (const r of rows) {
    const last = generations[generations.length - 1];
    if (last && last.generation === r.generation) {
      last.toSeq = r.seq;
      last.count += 1;
    } else {
      generations.push({ generation: r.generation, fromSeq: r.seq, toSeq: r.seq, count: 1, lease: r.lease, fromIndex: r.index });
    }
  }

  // Attempts: reconciled when their outcome came from the receiver, in doubt
  // when dispatched and never observed.
  const reconciled = [];
  const observed = new Set();
  for (const r of rows) {
    const e = events[r.index];
    if (e?.kind === "observed" && e.attempt) {
      observed.add(e.attempt.ordinal);
      if (e.attempt.reconciled) {
        const dispatchedBy = events.find((x) => x?.kind === "dispatched" && x.ordinal === e.attempt.ordinal);
        reconciled.push({
          seq: r.seq,
          ordinal: e.attempt.ordinal,
          routeId: e.attempt.route_id,
          reconciled: e.attempt.reconciled,
          outcome: outcomeText(e.attempt.outcome),
          startedAt: e.attempt.started_at_ms,
          completedAt: e.attempt.completed_at_ms,
          cost: e.attempt.cost,
          sentUnder: dispatchedBy?.lease_generation,
          settledUnder: r.generation,
        });
      }
    }
  }
  const inDoubt = events
    .filter((e) => e?.kind === "dispatched" && !observed.has(e.ordinal))
    .map((e) => ({ seq: e.seq, ordinal: e.ordinal, routeId: e.route_id, startedAt: e.started_at_ms, generation: e.lease_generation }));

  return { rows, generations, reconciled, inDoubt, brokenLinks: rows.filter((r) => r.link === "broken").map((r) => r.index) };
}
