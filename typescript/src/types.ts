// The wire types (docs/wire-format.md, docs/merges.md): JSON, camelCase, optional keys absent.

/** The error codes of the wire contract (a reply's `code`, a `ForkError`'s). */
export const ERROR_CODES = [
  "SESSION_NOT_FOUND",
  "SESSION_NOT_LIVE",
  "SESSION_ALREADY_EXISTS",
  "OPEN_TURN",
  "INVALID_BOUNDARY",
  "PRECONDITION_FAILED",
  "INVALID_REQUEST",
  "IDEMPOTENCY_CONFLICT",
  "INTERNAL",
  "WRONG_SHARD",
  "NOT_DESCENDANT",
  "ALREADY_MERGED",
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/** A session's live incarnation: its id and instance token. */
export interface LiveHandle {
  id: string;
  instance: string;
}

/** A session's header. */
export interface Header {
  version: number;
  id: string;
  createdAt: number;
  cwd?: string;
  parentSession?: string;
  seedLength?: number;
  keptFrom?: number;
}

/** An event to append (an edit): `type`, `data`, and any other fields, kept as given. */
export interface NewEvent {
  type: string;
  data?: unknown;
  [field: string]: unknown;
}

/** One child of a variant fan-out: its id (generated when absent) and its edits. */
export interface Variant {
  sessionId?: string;
  edits?: NewEvent[];
}

/** A summary child's seed: one `session/summary` event holding `data`, then the events from `keepFrom`. */
export interface Summary {
  keepFrom: number;
  data: unknown;
}

/** A fork request (the RQ job's payload). */
export interface ForkRequest {
  requestId?: string;
  source: string | LiveHandle;
  sessionId?: string;
  sessionIds?: string[];
  count?: number;
  replyTo?: string;
  traceparent?: string;
  boundary?: number;
  ifLength?: number;
  edits?: NewEvent[];
  variants?: Variant[];
  summary?: Summary;
}

/** `"summary"`: one `session/summary` event; `"events"`: the range's events themselves. */
export type MergeMode = "summary" | "events";

/** A merge's range of the child's events, inclusive. */
export interface SeqRange {
  fromSeq: number;
  toSeq: number;
}

interface MergeFields {
  requestId?: string;
  parent: string | LiveHandle;
  mode: MergeMode;
  summary?: unknown;
  range?: SeqRange;
  ifParentLength?: number;
  ifChildLength?: number;
  replyTo?: string;
  traceparent?: string;
}

/** A merge request: `child`'s events into `parent`, an ancestor of it. */
export interface MergeRequest extends MergeFields {
  op: "merge";
  child: string;
}

/** A select request: `winner` merged into `parent`, every other candidate abandoned. */
export interface SelectRequest extends MergeFields {
  op: "select";
  candidates: string[];
  winner: string;
}

export type AnyRequest = ForkRequest | MergeRequest | SelectRequest;

/** A fan-out's id that was not created, and why. */
export interface ChildError {
  sessionId: string;
  code: ErrorCode;
  message: string;
}

/** A fork's result: `session` (one child) or `sessions` and `failed` (a fan-out; `ok` false when any failed). */
export interface ForkResult {
  type: "fork/result";
  requestId: string;
  ok: boolean;
  session?: Header;
  sessions?: Header[];
  failed?: ChildError[];
}

interface Failure {
  requestId: string;
  ok: false;
  code: ErrorCode;
  message: string;
}

export interface ForkFailure extends Failure {
  type: "fork/error";
}

/** Where a merge's events came from: the child's range. */
export interface MergedFrom {
  session: string;
  fromSeq: number;
  toSeq: number;
}

/** A merge's result: the parent's new `length`, the parent's seqs `fromSeq..toSeq` of the merge's turn. */
export interface MergeResult {
  type: "merge/result";
  requestId: string;
  ok: true;
  parent: string;
  length: number;
  fromSeq: number;
  toSeq: number;
  mergedFrom: MergedFrom;
}

export interface MergeFailure extends Failure {
  type: "merge/error";
}

/** A select's result: a merge's, with the `winner` and the `abandoned` candidates. */
export interface SelectResult extends Omit<MergeResult, "type"> {
  type: "select/result";
  winner: string;
  abandoned: string[];
}

export interface SelectFailure extends Failure {
  type: "select/error";
}

export type ForkReply = ForkResult | ForkFailure;
export type MergeReply = MergeResult | MergeFailure;
export type SelectReply = SelectResult | SelectFailure;
export type Outcome = ForkReply | MergeReply | SelectReply;

/** A request's reply type, by the request's type. */
export type ReplyOf<R> = R extends MergeRequest ? MergeReply : R extends SelectRequest ? SelectReply : ForkReply;

/** The one error type a client throws for what it refuses before sending anything (`INVALID_REQUEST`). */
export class ForkError extends Error {
  readonly code: ErrorCode;

  constructor(code: ErrorCode, message: string) {
    super(message);
    this.name = "ForkError";
    this.code = code;
  }
}

/** No reply by the call's deadline (the request may run all the same: wait again with its id). */
export class TimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TimeoutError";
  }
}
