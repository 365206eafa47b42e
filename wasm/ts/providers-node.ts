/** `retryledger/providers` in Node: loads the module (as `retryledger` does), then the integration. */
import "./index.js";

export * from "./providers.js";
