/**
 * Output checks: validators the driver runs on what `dispatch` returned
 * (docs/REPAIR.md). A check turns an output into a verdict
 * (`{kind, validator, verdict, defects?}`) and the core judges the verdicts:
 * a failed `refusal` is `policy_denied` (non-retryable, never a fallback),
 * any other failed check `invalid_output`. Pass them as `checks: [...]` to
 * `runWithPolicy` and the integrations.
 *
 * - `outputCheck(fn, {validator})` wraps a plain function: `true` or
 *   `undefined` passes, `false` fails, a string or an array of strings (or
 *   of `{message, path}`) are the defects, a verdict object is taken as it
 *   is; anything else is not a verdict (the core's `output_verdict_invalid`).
 * - `schemaCheck(schema, {validator})` validates with any schema that has
 *   zod's `safeParse` (`{success}` or `{success: false, error: {issues}}`);
 *   JSON text is parsed first (`unparsable_json` when it does not parse).
 *
 * A check that throws, or whose verdict the core refuses, leaves the attempt
 * unrecognized (recorded, never retried): the run rejects with that error
 * as its cause.
 */

import type { CheckKind, Defect, OutputVerdict as Verdict } from "./types.js";

/** A check: an id, what it looks at, and the verdict on an output. */
export interface OutputCheck {
  readonly validator: string;
  readonly kind: CheckKind;
  /** The verdict on `output` (the core decodes it strictly). */
  check(output: unknown): Verdict;
}

/** What a plain check function may answer. */
export type CheckAnswer = boolean | undefined | string | Array<string | Defect> | Partial<Verdict>;

function verdictOf(got: unknown, kind: CheckKind, validator: string): Verdict {
  if (got !== null && typeof got === "object" && !Array.isArray(got) && "verdict" in got) {
    return { kind, validator, ...(got as Partial<Verdict>) } as Verdict;
  }
  if (got === true || got === undefined) return { kind, validator, verdict: "pass" };
  if (got === false) return { kind, validator, verdict: "defects", defects: [{ message: `rejected by ${validator}` }] };
  if (typeof got === "string") return { kind, validator, verdict: "defects", defects: [{ message: got }] };
  if (Array.isArray(got)) {
    if (got.length === 0) return { kind, validator, verdict: "pass" };
    return { kind, validator, verdict: "defects", defects: got.map((d) => (typeof d === "string" ? { message: d } : (d as Defect))) };
  }
  // Not a verdict: passed on as it is, for the core to refuse with its code.
  return { kind, validator, verdict: got as Verdict["verdict"] };
}

/** A plain function as a check (see the module's rules for its answers). */
export function outputCheck(fn: (output: unknown) => unknown, options: { validator: string; kind?: CheckKind }): OutputCheck {
  const kind = options.kind ?? "schema";
  const validator = options.validator;
  return { validator, kind, check: (output) => verdictOf(fn(output), kind, validator) };
}

/** The same check on `extract(output)` (the integrations run user validators on an answer's text this way). */
export function checkOn(check: OutputCheck, extract: (output: unknown) => unknown): OutputCheck {
  return { validator: check.validator, kind: check.kind, check: (output) => check.check(extract(output)) };
}

/** A schema with zod's `safeParse`. */
export interface SafeParseSchema {
  safeParse(value: unknown): { success: boolean; error?: { issues: ReadonlyArray<{ message: string; path: ReadonlyArray<PropertyKey> }> } | undefined };
}

function pointer(path: ReadonlyArray<PropertyKey>): string {
  return path.length === 0 ? "" : `/${path.map((p) => String(p).replaceAll("~", "~0").replaceAll("/", "~1")).join("/")}`;
}

/** Validate an output (JSON text is parsed first) with a zod-style schema; its issues are the defects. */
export function schemaCheck(schema: SafeParseSchema, options: { validator: string }): OutputCheck {
  const validator = options.validator;
  return {
    validator,
    kind: "schema",
    check(output) {
      let value = output;
      if (typeof output === "string") {
        try {
          value = JSON.parse(output);
        } catch (e) {
          return { kind: "unparsable_json", validator, verdict: "defects", defects: [{ message: e instanceof Error ? e.message : String(e) }] };
        }
      }
      const r = schema.safeParse(value);
      if (r.success) return { kind: "schema", validator, verdict: "pass" };
      const issues = r.error?.issues ?? [];
      const defects = issues.map((i) => (i.path.length === 0 ? { message: i.message } : { message: i.message, path: pointer(i.path) }));
      return { kind: "schema", validator, verdict: "defects", defects: defects.length > 0 ? defects : [{ message: `rejected by ${validator}` }] };
    },
  };
}

/** A compiled JSON Schema validator with ajv's contract: returns whether the data is valid, and leaves its `errors`. */
export interface CompiledValidator {
  (data: unknown): boolean | PromiseLike<unknown>;
  errors?: ReadonlyArray<{ instancePath?: string; message?: string }> | null;
}

/** Validate an output (JSON text is parsed first) with a compiled JSON Schema validator (`ajv.compile(schema)`); its errors are the defects. */
export function ajvCheck(validate: CompiledValidator, options: { validator: string }): OutputCheck {
  const validator = options.validator;
  return {
    validator,
    kind: "schema",
    check(output) {
      let value = output;
      if (typeof output === "string") {
        try {
          value = JSON.parse(output);
        } catch (e) {
          return { kind: "unparsable_json", validator, verdict: "defects", defects: [{ message: e instanceof Error ? e.message : String(e) }] };
        }
      }
      const ok = validate(value);
      if (typeof ok !== "boolean") throw new TypeError("ajvCheck takes a synchronous validator (no $async schema)");
      if (ok) return { kind: "schema", validator, verdict: "pass" };
      const defects = (validate.errors ?? []).map((e) =>
        e.instancePath !== undefined && e.instancePath !== "" ? { message: e.message ?? "invalid", path: e.instancePath } : { message: e.message ?? "invalid" },
      );
      return { kind: "schema", validator, verdict: "defects", defects: defects.length > 0 ? defects : [{ message: `rejected by ${validator}` }] };
    },
  };
}

/** A failed verdict's defect, with the check's kind and validator (what `repair` receives). */
export interface RepairDefect extends Defect {
  kind: CheckKind;
  validator: string;
}

/** The defects of the failed verdicts, each with its kind and validator. */
export function defectsOf(verdicts: readonly Verdict[]): RepairDefect[] {
  const out: RepairDefect[] = [];
  for (const v of verdicts) {
    if (v.verdict !== "defects") continue;
    for (const d of v.defects ?? []) out.push({ kind: v.kind, validator: v.validator, ...d });
  }
  return out;
}

// ---------------------------------------------------------------- the integrations' built-in checks

/**
 * What an SDK answer says, as the built-in checks read it: the refusal text
 * (`undefined`: no refusal), why it was cut (`undefined`: it was not), its
 * text content (`undefined`: none) and whether it carries other content (tool calls).
 */
export interface AnswerParts {
  refusal: string | undefined;
  cut: string | undefined;
  text: string | undefined;
  other: boolean;
}

/** Options of the integrations' `answerChecks`. */
export interface AnswerCheckOptions {
  /** A JSON output was asked for: text that does not parse is `unparsable_json`. */
  json?: boolean;
  /** The user's checks, run on the answer's text. */
  validators?: readonly OutputCheck[];
}

/** @internal The built-in checks of an SDK's answers, then the user's validators on the answer's text. */
export function answerChecks(prefix: string, parts: (answer: unknown) => AnswerParts, options: AnswerCheckOptions = {}): OutputCheck[] {
  const out: OutputCheck[] = [
    outputCheck((a) => { const r = parts(a).refusal; return r === undefined ? true : [r === "" ? "refused" : r]; }, { validator: `${prefix}.refusal`, kind: "refusal" }),
    outputCheck((a) => { const c = parts(a).cut; return c === undefined ? true : [c]; }, { validator: `${prefix}.truncated`, kind: "truncated" }),
    outputCheck((a) => { const p = parts(a); return p.other || (p.text !== undefined && p.text.trim() !== "") ? true : ["the answer has no content"]; }, { validator: `${prefix}.empty`, kind: "empty" }),
  ];
  if (options.json === true) {
    out.push(
      outputCheck(
        (a) => {
          const text = parts(a).text;
          if (text === undefined) return true; // nothing to parse: `empty` says so
          try {
            JSON.parse(text);
            return true;
          } catch (e) {
            return [e instanceof Error ? e.message : String(e)];
          }
        },
        { validator: `${prefix}.json`, kind: "unparsable_json" },
      ),
    );
  }
  for (const v of options.validators ?? []) out.push(checkOn(v, (a) => parts(a).text));
  return out;
}

function field(o: unknown, name: string): unknown {
  return o !== null && typeof o === "object" ? (o as Record<string, unknown>)[name] : undefined;
}

/** @internal A chat completion's or a response's refusal, cut, text and other content. */
export function openaiAnswerParts(answer: unknown): AnswerParts {
  const choices = field(answer, "choices");
  if (Array.isArray(choices) && choices.length > 0) {
    const choice = choices[0] as unknown;
    const message = field(choice, "message");
    const refusal = field(message, "refusal");
    const content = field(message, "content");
    const tools = field(message, "tool_calls");
    return {
      refusal: typeof refusal === "string" && refusal !== "" ? refusal : undefined,
      cut: field(choice, "finish_reason") === "length" ? "finish_reason: length" : undefined,
      text: typeof content === "string" ? content : undefined,
      other: Array.isArray(tools) && tools.length > 0,
    };
  }
  let refusal: string | undefined;
  const texts: string[] = [];
  let other = false;
  const output = field(answer, "output");
  for (const item of Array.isArray(output) ? output : []) {
    const type = field(item, "type");
    if (type === "message") {
      const content = field(item, "content");
      for (const part of Array.isArray(content) ? content : []) {
        const kind = field(part, "type");
        if (kind === "refusal") refusal = String(field(part, "refusal") ?? "refused");
        else if (kind === "output_text") texts.push(String(field(part, "text") ?? ""));
      }
    } else if (type === "function_call" || type === "custom_tool_call") {
      other = true;
    }
  }
  const cut =
    field(answer, "status") === "incomplete" && field(field(answer, "incomplete_details"), "reason") === "max_output_tokens"
      ? "incomplete: max_output_tokens"
      : undefined;
  return { refusal, cut, text: texts.length > 0 ? texts.join("") : undefined, other };
}

/** @internal A message's refusal, cut, text and other content (`stop_reason`, content blocks). */
export function anthropicAnswerParts(answer: unknown): AnswerParts {
  const stop = field(answer, "stop_reason");
  const texts: string[] = [];
  let other = false;
  const content = field(answer, "content");
  for (const block of Array.isArray(content) ? content : []) {
    const type = field(block, "type");
    if (type === "text") texts.push(String(field(block, "text") ?? ""));
    else if (type === "tool_use") other = true;
  }
  return {
    refusal: stop === "refusal" ? "stop_reason: refusal" : undefined,
    cut: stop === "max_tokens" ? "stop_reason: max_tokens" : undefined,
    text: texts.length > 0 ? texts.join("") : undefined,
    other,
  };
}
