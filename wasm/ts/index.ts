/**
 * retryledger for Node.js: the core as WebAssembly (loaded synchronously at
 * import), its public surface in camelCase, and the `runWithPolicy` driver.
 */

import { createRequire } from "node:module";
import { setBindings, type RawBindings } from "./core.js";

const require = createRequire(import.meta.url);
setBindings(require("../pkg-node/retryledger_wasm.js") as RawBindings);

export * from "./api.js";
