// Compiled by `tsc --noEmit --strict` (tsconfig.check.json), never run: the
// declarations narrow on their tags and reject what the documents forbid.
import {
  AttemptError,
  planNext,
  verifyBundle,
  classifyHttp,
  runWithPolicy,
  DecodeError,
  RunStoppedError,
  type Attempts,
  type Decision,
  type Outcome,
  type Policy,
  type Terminal,
  type Verdict,
} from "../dist/index.js";
import { openaiDispatch, type OpenAIRequestOptions } from "../dist/openai.js";
import { init, validatePolicy as validateInBrowser } from "../dist/web.js";

declare const policy: Policy;
const attempts: Attempts = { attempts: [], schema: "retryledger.attempts.v1" };

const d: Decision = planNext(policy, attempts);
if (d.kind === "dispatch") {
  const n: number = d.not_before_ms;
  const r: string = d.route_id;
  void [n, r];
  // @ts-expect-error a dispatch has no terminal
  void d.terminal;
} else {
  const t: Terminal = d.terminal;
  void t;
}

function describe(o: Outcome): string {
  switch (o.class) {
    case "success":
      return "ok";
    case "retryable":
      return `${o.kind} ${o.retry_after_ms ?? 0}`;
    case "non_retryable":
      return o.kind;
    case "indeterminate":
      return o.kind;
  }
}
void describe(classifyHttp({ status: 429, headers: [["retry-after", "1"]] }));

const v: Verdict = verifyBundle("{}");
if (v.kind === "drift") {
  const code: string = v.code;
  void code;
} else {
  const digest: string = v.receipt_sha256;
  void digest;
}

// @ts-expect-error not a retryable kind
AttemptError.retryable("rejected");
// @ts-expect-error a terminal is one of the named ones
const badTerminal: Terminal = "stop_everything";
void badTerminal;
// @ts-expect-error documents never hold null
const badAttempts: Attempts = { attempts: [], cancelled_at_ms: null, schema: "retryledger.attempts.v1" };
void badAttempts;

async function drive(): Promise<string> {
  try {
    const { result, receipt } = await runWithPolicy(policy, async (step, signal) => {
      step.charge(10);
      void signal.aborted;
      return `${step.routeId}#${step.routeOrdinal}`;
    }, { idempotencyKey: "k" });
    const t: "completed" | Terminal = receipt.terminal;
    void t;
    return result;
  } catch (e) {
    if (e instanceof RunStoppedError) {
      const t: Terminal = e.terminal;
      return `${t} ${e.bundle.receipt.attempt_count}`;
    }
    if (e instanceof DecodeError) return e.code;
    throw e;
  }
}
void drive;

declare const client: { maxRetries: number; chat: { completions: { create(body: object, options: OpenAIRequestOptions): Promise<{ id: string }> } } };
const dispatch = openaiDispatch({ primary: client }, (c, options) => c.chat.completions.create({}, options));
void dispatch;

async function browser(): Promise<string> {
  await init();
  return validateInBrowser(policy);
}
void browser;
