/**
 * Loaded before the WebAssembly glue in the Temporal workflow isolate. The
 * isolate replaces `FinalizationRegistry` with a constructor that throws
 * (garbage collection is not deterministic); the glue uses it when it is
 * defined. Where constructing one throws, it is removed, so the glue's
 * objects are freed explicitly and never by the collector. Anywhere else
 * nothing changes.
 */

const g = globalThis as { FinalizationRegistry?: unknown };
if (typeof g.FinalizationRegistry === "function") {
  try {
    new FinalizationRegistry(() => undefined);
  } catch {
    g.FinalizationRegistry = undefined;
  }
}

export {};
