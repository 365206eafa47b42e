#!/usr/bin/env node
/**
 * `npx retryledger verify BUNDLE.json`: what `python -m retryledger verify`
 * does, with the same exit codes. 0 when the bundle (or a repair chain,
 * `retryledger.repair_chain.v1`) replays to its sealed receipt, 1 on drift,
 * 2 on bad input (unreadable file, malformed document, invalid policy,
 * usage), with a one-line reason.
 */

import { readFileSync } from "node:fs";
import { verifyBundle, verifyRepairChain } from "./index.js";
import { RetryledgerError } from "./errors.js";

const EXIT_VERIFIED = 0;
const EXIT_DRIFT = 1;
const EXIT_BAD_INPUT = 2;
const USAGE = "usage: npx retryledger verify BUNDLE.json";

function isChain(text: string): boolean {
  try {
    const doc = JSON.parse(text) as unknown;
    return typeof doc === "object" && doc !== null && (doc as { schema?: unknown }).schema === "retryledger.repair_chain.v1";
  } catch {
    return false;
  }
}

function verify(path: string): number {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    console.error(`bad input: cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? String(e)}`);
    return EXIT_BAD_INPUT;
  }
  try {
    if (isChain(text)) {
      const v = verifyRepairChain(text) as Record<string, unknown>;
      if (v.kind === "verified") {
        const n = Number(v.repairs);
        console.log(`verified: ${String(v.terminal)} after ${n} repair${n !== 1 ? "s" : ""}, chain sha256 ${String(v.chain_sha256)}`);
        return EXIT_VERIFIED;
      }
      console.log(`drift: ${String(v.code)} at ${String(v.path)} (link index ${String(v.link_index)}): ${String(v.message)}`);
      return EXIT_DRIFT;
    }
    const v = verifyBundle(text) as unknown as Record<string, unknown>;
    if (v.kind === "verified") {
      console.log(`verified: ${String(v.terminal)}, receipt sha256 ${String(v.receipt_sha256)}`);
      return EXIT_VERIFIED;
    }
    const attempt = v.attempt_index === undefined ? "" : ` (attempt index ${String(v.attempt_index)})`;
    console.log(`drift: ${String(v.code)} at ${String(v.path)}${attempt}: ${String(v.message)}`);
    return EXIT_DRIFT;
  } catch (e) {
    if (e instanceof RetryledgerError) {
      console.error(`bad input: ${e.message}`);
      return EXIT_BAD_INPUT;
    }
    throw e;
  }
}

const args = process.argv.slice(2);
if (args.length === 2 && args[0] === "verify" && args[1] !== undefined) {
  process.exitCode = verify(args[1]);
} else {
  console.error(USAGE);
  process.exitCode = EXIT_BAD_INPUT;
}
