/**
 * retryledger for browsers (and any host with `fetch` and ES modules): call
 * `await init()` once, then use the same API as in Node.
 *
 * ```js
 * import { init, verifyBundle } from "./wasm/dist/web.js";
 * await init();                       // fetches ../pkg-web/retryledger_wasm_bg.wasm
 * const verdict = verifyBundle(text); // { kind: "verified", ... } or { kind: "drift", ... }
 * ```
 */

import initModule, * as wasm from "../pkg-web/retryledger_wasm.js";
import type { InitInput } from "../pkg-web/retryledger_wasm.js";
import { setBindings, type RawBindings } from "./core.js";

/** Where the module comes from: a URL or request, a `Response`, its bytes, or a compiled module. */
export type ModuleSource = InitInput | Promise<InitInput>;

let ready: Promise<void> | undefined;

/**
 * Load and instantiate the WebAssembly module once (by default
 * `retryledger_wasm_bg.wasm` beside the glue in `pkg-web/`); later calls
 * return the same promise.
 */
export function init(source?: ModuleSource): Promise<void> {
  ready ??= initModule(source === undefined ? undefined : { module_or_path: source }).then(() => {
    setBindings(wasm as unknown as RawBindings);
  });
  return ready;
}

export * from "./api.js";
