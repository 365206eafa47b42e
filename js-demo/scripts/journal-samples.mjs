// The journal view's samples: a few journals of tests/vectors/journal.json
// (read in place at build time), each as the file the view opens:
// {"policy": …, "events": […], "reconciliation"?: …}, with the vector's name
// and what it expects.
//
//   node js-demo/scripts/journal-samples.mjs tests/vectors/journal.json OUT.json
import { readFileSync, writeFileSync } from "node:fs";

const SAMPLES = [
  ["verify_reference_journal", "clean: the reference run, one owner"],
  ["verify_fallback_journal", "clean: a fallback run under a later lease"],
  ["verify_recovered_journal", "takeover: generation 2 reconciles attempt 3 (succeeded)"],
  ["recover_reference_prefix_12_after_dispatched", "crash after a dispatch: recovery asks the receiver"],
  ["reconcile_in_progress_then_succeeded", "reconciliation answers: in progress, then succeeded"],
  ["reconcile_failed_no_effect_permits_the_next_dispatch", "reconciliation answer: failed with no effect"],
  ["verify_broken_chain", "broken chain"],
  ["verify_lower_lease_generation", "a fenced owner's event (lower lease generation)"],
  ["verify_seq_gap", "a gap in seq"],
];

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  console.error("usage: journal-samples.mjs tests/vectors/journal.json OUT.json");
  process.exit(2);
}
const vectors = JSON.parse(readFileSync(input, "utf8"));
const byName = new Map(vectors.cases.map((c) => [c.name, c]));
const asDoc = (v) => (typeof v === "string" ? JSON.parse(v) : v);
const samples = SAMPLES.map(([name, title]) => {
  const c = byName.get(name);
  if (!c) throw new Error(`${input} has no case ${name}`);
  const journal = { policy: asDoc(c.input.policy), events: asDoc(c.input.events) };
  if (c.input.reconciliation !== undefined) journal.reconciliation = asDoc(c.input.reconciliation);
  return { name, title, expect: c.expect, journal };
});
writeFileSync(output, JSON.stringify({ source: "tests/vectors/journal.json", samples }));
console.log(`${output}: ${samples.length} journals`);
