// The only place the page touches the WebAssembly core: the web build of the
// npm package's crate (JSON text in, JSON text out; failures are thrown as the
// core's error JSON). Errors become Error objects with code, family and path.
// The fleet view's simulator is a separate module, run in fleet-worker.js.
import init, { verify_bundle, digest, journal_verify, journal_recover } from "./pkg/retryledger_wasm.js";

export function coreError(thrown) {
  let info = null;
  try {
    info = typeof thrown === "string" ? JSON.parse(thrown) : null;
  } catch {
    info = null;
  }
  if (!info || typeof info.code !== "string") return thrown instanceof Error ? thrown : new Error(String(thrown));
  const err = new Error(info.message);
  err.code = info.code;
  err.family = info.family;
  err.path = info.path;
  err.attemptIndex = info.attempt_index;
  return err;
}

function call(fn, ...args) {
  try {
    return fn(...args);
  } catch (thrown) {
    throw coreError(thrown);
  }
}

export async function loadCore() {
  await init({ module_or_path: new URL("./pkg/retryledger_wasm_bg.wasm", import.meta.url) });
  return {
    verifyBundle: (text) => JSON.parse(call(verify_bundle, text)),
    digest: (text) => call(digest, text),
    // The journal's replay against the policy (docs/JOURNAL.md), and what a
    // new owner would do with it; reconciliation is JSON text or undefined.
    journalVerify: (policy, events) => JSON.parse(call(journal_verify, policy, events)),
    journalRecover: (policy, events, reconciliation) => JSON.parse(call(journal_recover, policy, events, reconciliation)),
  };
}
