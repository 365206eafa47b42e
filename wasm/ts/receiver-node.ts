/** `retryledger/receiver` in Node: loads the module (as `retryledger` does), then the guard. */
import "./index.js";

export * from "./receiver.js";
