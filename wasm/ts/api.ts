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
  sha256Hex,
  toText,
  type Input,
} from "./core.js";
export {
  AttemptError,
  classifyError,
  httpObservationOf,
  httpOutcome,
  isOutcome,
  retryAfterHeaders,
  type Classifier,
  type ClassifyContext,
} from "./classify.js";
export { runWithPolicy, type DispatchFn, type RunOptions, type RunResult, type Step } from "./driver.js";
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
