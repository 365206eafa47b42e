/**
 * Provider asynchronous jobs (docs/JOBS.md): the documents of the policy's
 * `async_job` section, what a dispatch of a job is, what an attempt
 * records, and the receipt's summary. The core decides every step; a host
 * reports the job id and status it saw with `Session.setJob`.
 */
import type { Sha256Hex } from "./types.js";

/** A job's status as the provider reports it (an Anthropic batch that `ended` is `completed`). */
export type JobStatus = "queued" | "in_progress" | "completed" | "failed" | "cancelled" | "incomplete" | "expired";

/** Submit the request, or poll the accepted job. */
export type JobKind = "submit" | "poll";

/** The policy's `async_job` section. */
export interface AsyncJob {
  max_polls: number;
  poll_base_ms: number;
  poll_max_ms: number;
}

/** What a planned dispatch of a job is. */
export interface JobStep {
  /** The accepted job's id digest, for a poll. */
  job_sha256?: Sha256Hex;
  kind: JobKind;
  /** The poll's number, from 1, for a poll. */
  poll?: number;
}

/** What an attempt of a job was and saw. */
export interface JobRecord {
  job_sha256?: Sha256Hex;
  kind: JobKind;
  poll?: number;
  status?: JobStatus;
}

/** The receipt's summary of a job. */
export interface JobSummary {
  job_sha256?: Sha256Hex;
  /** The run ended with the accepted job still running: the host cancels it. */
  left_running: boolean;
  polls: number;
  status?: JobStatus;
  submits: number;
}
