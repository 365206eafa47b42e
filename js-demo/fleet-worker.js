// The fleet view's worker: the simulator module (retryledger-sim over the
// core, sim-wasm/) runs here so that a long run never freezes the page.
// Messages in: {id, op: "scenarios"} or {id, op: "simulate", name, text, seed};
// out: {id, ok} or {id, error: {code, path, message}}.
import init, { scenarios, simulate } from "./sim/retryledger_sim.js";

const ready = init({ module_or_path: new URL("./sim/retryledger_sim_bg.wasm", import.meta.url) });

function asError(thrown) {
  if (typeof thrown === "string") {
    try {
      const info = JSON.parse(thrown);
      if (info && typeof info.code === "string") return info;
    } catch {
      // not the simulator's error JSON
    }
  }
  // A trap (it should not happen) or a load failure: coded, never thrown on.
  return { code: "internal", path: "", message: String(thrown?.message ?? thrown) };
}

self.onmessage = async (event) => {
  const { id, op, name, text, seed } = event.data ?? {};
  try {
    await ready;
    if (op === "scenarios") {
      self.postMessage({ id, ok: JSON.parse(scenarios()) });
    } else if (op === "simulate") {
      const started = performance.now();
      const ok = JSON.parse(simulate(name, text, seed));
      self.postMessage({ id, ok, ms: Math.round(performance.now() - started) });
    } else {
      self.postMessage({ id, error: { code: "usage", path: "", message: `unknown operation ${op}` } });
    }
  } catch (thrown) {
    self.postMessage({ id, error: asError(thrown) });
  }
};
