// Shared by the framework adapters' tests (ai-sdk, langchain): the output
// check their repair tests run.
import { outputCheck } from "../dist/index.js";

/** A check that the answer is JSON with an integer `n`. */
export const hasN = outputCheck(
  (text) => {
    try {
      const v = JSON.parse(String(text));
      return Number.isInteger(v?.n) ? true : ["n is not an integer"];
    } catch {
      return ["not JSON"];
    }
  },
  { validator: "has_n" },
);
