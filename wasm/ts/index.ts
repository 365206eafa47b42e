/**
 * retryledger for Node.js: the core as WebAssembly (loaded synchronously at
 * import), its public surface in camelCase, and the `runWithPolicy` driver.
 */

import * as crypto from "node:crypto";
import { createHash } from "node:crypto";
import { createRequire } from "node:module";
import { setBindings, setHostSha256, type RawBindings } from "./core.js";

const require = createRequire(import.meta.url);
setBindings(require("../pkg-node/retryledger_wasm.js") as RawBindings);
// OpenSSL's SHA-256 of the same UTF-8 bytes: byte-identical digests, several times faster than in WebAssembly.
// One call where Node has the one-shot `crypto.hash` (20.12 and later), else a Hash object.
const oneShot = (crypto as { hash?: (algorithm: string, data: string | Uint8Array, encoding: "hex") => string }).hash;
setHostSha256(
  oneShot !== undefined
    ? (data) => oneShot("sha256", data, "hex")
    : (data) => (typeof data === "string" ? createHash("sha256").update(data, "utf8") : createHash("sha256").update(data)).digest("hex"),
);

export * from "./api.js";
export * from "./job.js";
export {
  runStream,
  StreamProtocolError,
  type StreamDispatchFn,
  type StreamReader,
  type StreamRun,
  type StreamRunEvent,
  type StreamRunOptions,
  type StreamStep,
} from "./stream.js";
