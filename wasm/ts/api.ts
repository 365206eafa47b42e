/** Everything the package exports, whichever build of the module is installed. */

export {
  CompiledPolicy,
  compilePolicy,
  validatePolicy,
  planNext,
  evaluate,
  seal,
  verifyBundle,
  digest,
  parseRetryAfter,
  classifyHttp,
  judge,
  checkOutcome,
  requestSha256,
  buildPolicy,
  liftRequest,
  checkPriceSchedule,
  priceCost,
  canonicalRequest,
  idempotencyKeySha256,
  sha256Hex,
  toText,
  type Input,
} from "./core.js";
export { Session, RETURNED, type Observation } from "./session.js";
export { AttemptError, factsOf, type Classifier, type FactsOptions } from "./facts.js";
export { withPolicy, type Retrying, type WithPolicyOptions } from "./wrap.js";
export { runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
export * from "./tables.js";
export {
  RetryledgerError,
  DecodeError,
  PolicyError,
  DriftError,
  ReceiptError,
  HttpError,
  RunError,
  RunStoppedError,
  UnrecognizedDispatchError,
  RunCancelledError,
  type DecodeCode,
  type PolicyCode,
  type DriftCode,
  type ReceiptCode,
  type HttpCode,
  type RunCode,
  type ErrorCode,
  type ErrorFamily,
  type ErrorDetails,
  type StoppedDetails,
} from "./errors.js";
export type * from "./types.js";
