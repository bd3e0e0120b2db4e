// The scheduler's client: submit requests, wait for their replies (the Python clients' semantics).
import { randomUUID } from "node:crypto";
import { Redis } from "ioredis";
import type { RedisOptions } from "ioredis";
import { conflict, identity, sameRequest } from "./identity.js";
import { Scripts } from "./scripts.js";
import type { EnqueueMode } from "./scripts.js";
import {
  ForkError,
  TimeoutError,
  type AnyRequest,
  type ForkReply,
  type ForkRequest,
  type LiveHandle,
  type MergeMode,
  type MergeReply,
  type MergeRequest,
  type NewEvent,
  type Outcome,
  type ReplyOf,
  type SelectReply,
  type SelectRequest,
  type Summary,
  type Variant,
} from "./types.js";

/** The longest a call waits for its reply (seconds): a day. */
export const MAX_WAIT = 86400;
/** How long `submit` may take (seconds): the enqueue is sent again while its reply is lost. */
export const SUBMIT_RETRY_FOR = 10;
/** Seconds past a call's deadline at which a call still in Redis is cut (`TimeoutError`). */
export const HARD_AFTER = 0.5;
/** The largest request JSON the enqueue script takes, in bytes. */
export const REQUEST_LIMIT = 65536;
const REQUEST_ID = /^[A-Za-z0-9_-]{1,128}$/;
const JOB_FUNCTION = "sessionfork.jobs.fork";

/** A client's settings: the `SESSIONFORK_*` settings the Python clients read, with their defaults. */
export interface ClientOptions {
  /** The RQ queue (`SESSIONFORK_QUEUE`): `sessionfork`. */
  queue?: string;
  /** The default reply channel (`SESSIONFORK_REPLY_CHANNEL`): `sf:replies`. */
  replyChannel?: string;
  /** How the enqueue script runs (`SESSIONFORK_ENQUEUE`): `auto`. */
  enqueue?: EnqueueMode;
  /** The job's time-out in seconds (`SESSIONFORK_JOB_TIMEOUT`): 30. */
  jobTimeout?: number;
  /** Seconds the finished job is kept (`SESSIONFORK_JOB_TTL`): 600. */
  jobTtl?: number;
  /** Seconds a failed job is kept (`SESSIONFORK_OUTCOME_TTL`): 86400. */
  outcomeTtl?: number;
  /** RQ's retries of a job (`SESSIONFORK_RETRIES`): 3. */
  retries?: number;
  /** Seconds a wait goes without news before it reads the stored outcome again: 1. */
  recheckEvery?: number;
  /** Makes request ids: `req-<uuid4>`. */
  newId?: () => string;
}

/** A fork's options (`Client.request`, `Client.fork`): at most one of sessionId, sessionIds, count, variants. */
export interface ForkOptions {
  sessionId?: string;
  sessionIds?: string[];
  count?: number;
  requestId?: string;
  replyTo?: string;
  boundary?: number;
  ifLength?: number;
  edits?: NewEvent[];
  variants?: Variant[];
  summary?: Summary;
}

/** A merge's or select's options: `mode` required; `summary` with mode `summary` only. */
export interface MergeOptions {
  mode: MergeMode;
  summary?: unknown;
  /** The child's (the winner's) events to merge, inclusive: `[fromSeq, toSeq]`. */
  range?: [number, number];
  ifParentLength?: number;
  ifChildLength?: number;
  requestId?: string;
  replyTo?: string;
}

/** A call's time bound (seconds from 0 to `MAX_WAIT`), default 10. */
export interface Timed {
  timeout?: number;
}

interface Waiter {
  wake: () => void;
}

function invalid(message: string): ForkError {
  return new ForkError("INVALID_REQUEST", message);
}

function checkRequestId(id: unknown, what = "request id"): string {
  if (typeof id !== "string" || !REQUEST_ID.test(id)) {
    throw invalid(`invalid ${what} ${JSON.stringify(id)}: expected 1-128 of [A-Za-z0-9_-] (it is the RQ job id)`);
  }
  return id;
}

/** `timeout` as a call's seconds: a number from 0 to `MAX_WAIT`, else `INVALID_REQUEST` before anything is sent. */
export function waitBound(timeout: unknown): number {
  if (typeof timeout !== "number" || !Number.isFinite(timeout) || timeout < 0 || timeout > MAX_WAIT) {
    throw invalid(`timeout must be a number of seconds from 0 to ${MAX_WAIT}, not ${String(timeout)}`);
  }
  return timeout;
}

function given<T extends object>(fields: T): T {
  return Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined && v !== null)) as T;
}

/** A lost reply (a dropped connection, a time-out): the command may be sent again. A server's error is not. */
function lost(error: unknown): boolean {
  return !(error instanceof ForkError) && !(error instanceof Error && error.name === "ReplyError");
}

const pause = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, Math.max(ms, 0)));

/** `work`, or a `TimeoutError(what)` at `deadline` (ms since the epoch), whatever `work` is doing. */
async function cut<T>(deadline: number, what: string, work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new TimeoutError(what)), Math.max(deadline - Date.now(), 0));
  });
  work.catch(() => undefined); // an abandoned call's error is nobody's
  try {
    return await Promise.race([work, expired]);
  } finally {
    clearTimeout(timer);
  }
}

/** `send()`, sent again after a back-off while its reply is lost, until `deadline`. */
async function again<T>(send: () => Promise<T>, deadline: number): Promise<T> {
  for (let retryIn = 50; ; retryIn = Math.min(retryIn * 2, 1000)) {
    try {
      return await send();
    } catch (error) {
      if (!lost(error) || deadline - Date.now() <= retryIn) throw error;
      await pause(retryIn);
    }
  }
}

/** RQ's timestamp: `2026-11-30T12:00:00.000000Z`. */
function stamp(when: Date): string {
  return when.toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
}

/**
 * A scheduler's handle on the fork queue of one queue server: the Python clients' semantics.
 *
 * A request id (given, or generated as `req-<uuid4>`) makes a submission idempotent: submitting it
 * again, or waiting again after a time-out, never forks twice and answers the first outcome; an id
 * used before for a different request answers `IDEMPOTENCY_CONFLICT`. `fork`, `merge`, `select`
 * and `wait` answer or throw `TimeoutError` by their deadline (`HARD_AFTER` past it at most),
 * `submit` within `SUBMIT_RETRY_FOR` seconds, whatever the server does. The answer is always the
 * outcome stored under the request id: a message on the reply channel only wakes the waiter.
 */
export class Client {
  readonly redis: Redis;
  private readonly options: Required<ClientOptions>;
  private readonly scripts: Scripts;
  private subscriber: Redis | undefined;
  private readonly subscribed = new Map<string, Promise<void>>();
  private readonly waiters = new Map<string, Set<Waiter>>();
  private readonly owned: boolean;

  /** A client on `redis` (an ioredis connection; `Client.fromUrl` makes one it closes with `close`). */
  constructor(redis: Redis, options: ClientOptions = {}, owned = false) {
    this.redis = redis;
    this.owned = owned;
    this.options = {
      queue: "sessionfork",
      replyChannel: "sf:replies",
      enqueue: "auto",
      jobTimeout: 30,
      jobTtl: 600,
      outcomeTtl: 86400,
      retries: 3,
      recheckEvery: 1,
      newId: () => `req-${randomUUID()}`,
      ...given(options),
    };
    this.scripts = new Scripts(redis, this.options.enqueue);
  }

  /** A client of the queue server at `url` (`redis://`, `rediss://`), closed by `close`. */
  static fromUrl(url: string, options: ClientOptions = {}, redisOptions: RedisOptions = {}): Client {
    return new Client(new Redis(url, { connectTimeout: 5000, ...redisOptions }), options, true);
  }

  /** Build a fork request (no I/O) of `source`, with a request id. `INVALID_REQUEST` for a bad request id. */
  request(source: string | LiveHandle, options: ForkOptions = {}): ForkRequest {
    const requestId = checkRequestId(options.requestId ?? this.options.newId());
    return given({ requestId, source, ...options });
  }

  /** Build a merge request (no I/O): `child`'s events into `parent`. */
  mergeRequest(parent: string | LiveHandle, child: string, options: MergeOptions): MergeRequest {
    return { op: "merge", ...this.mergeFields(parent, options), child } as MergeRequest;
  }

  /** Build a select request (no I/O): `winner` merged into `parent`, the other `candidates` abandoned. */
  selectRequest(parent: string | LiveHandle, candidates: string[], winner: string, options: MergeOptions): SelectRequest {
    if (!Array.isArray(candidates) || candidates.length === 0 || !candidates.includes(winner)) {
      throw invalid(`invalid winner ${JSON.stringify(winner)}: expected one of the candidates`);
    }
    return { op: "select", ...this.mergeFields(parent, options), candidates, winner } as SelectRequest;
  }

  private mergeFields(parent: string | LiveHandle, options: MergeOptions): object {
    const { mode, summary, range, requestId, ...rest } = options;
    if (mode !== "summary" && mode !== "events") {
      throw invalid(`invalid mode ${JSON.stringify(mode)}: expected summary or events`);
    }
    if (mode === "summary" && (summary === undefined || summary === null)) {
      throw invalid("invalid summary: mode summary needs a summary (any JSON but null)");
    }
    if (mode === "events" && summary !== undefined && summary !== null) {
      throw invalid("invalid summary: only mode summary takes a summary");
    }
    return given({
      requestId: checkRequestId(requestId ?? this.options.newId()),
      parent,
      mode,
      summary,
      range: range === undefined ? undefined : { fromSeq: range[0], toSeq: range[1] },
      ...rest,
    });
  }

  /** Enqueue `request`; its request id. Enqueuing an id already queued is a no-op. Sent again while its reply is lost, for up to `SUBMIT_RETRY_FOR` seconds (then `TimeoutError`: it may be enqueued all the same). */
  async submit(request: AnyRequest): Promise<string> {
    const [requestId, call] = this.job(request);
    const deadline = Date.now() + SUBMIT_RETRY_FOR * 1000;
    const work = again(() => this.scripts.enqueue(...call), deadline);
    await cut(deadline + HARD_AFTER * 1000, `request ${requestId} not enqueued within ${SUBMIT_RETRY_FOR}s`, work);
    return requestId;
  }

  /**
   * The reply to a submitted request (typed by the request), or `TimeoutError` when none comes
   * within `timeout` seconds. A request whose id was used before for a different request answers
   * `IDEMPOTENCY_CONFLICT`. `request` may be a request id alone (a request submitted elsewhere):
   * its outcome, whatever request it was, woken on `replyTo` (default: the reply channel).
   */
  async wait<R extends AnyRequest>(request: R, timeout: number): Promise<ReplyOf<R>>;
  async wait(request: string, timeout: number, options?: { replyTo?: string }): Promise<Outcome>;
  async wait(request: AnyRequest | string, timeout: number, options: { replyTo?: string } = {}): Promise<Outcome> {
    const seconds = waitBound(timeout);
    const asked = typeof request === "string" ? null : request;
    const requestId = checkRequestId(typeof request === "string" ? request : request.requestId);
    const channel = asked?.replyTo ?? options.replyTo ?? this.options.replyChannel;
    const deadline = Date.now() + seconds * 1000;
    return this.bounded(requestId, seconds, deadline, this.answer(requestId, asked, channel, deadline, seconds));
  }

  /** Submit a fork of `source` and wait for its reply, within `timeout` seconds (default 10). */
  async fork(source: string | LiveHandle, options: ForkOptions & Timed = {}): Promise<ForkReply> {
    const { timeout, ...rest } = options;
    return this.runRequest(this.request(source, rest), timeout ?? 10);
  }

  /** Submit a merge of `child` into `parent` and wait for its reply (`MergeResult` or `MergeFailure`). */
  async merge(parent: string | LiveHandle, child: string, options: MergeOptions & Timed): Promise<MergeReply> {
    const { timeout, ...rest } = options;
    return this.runRequest(this.mergeRequest(parent, child, rest), timeout ?? 10);
  }

  /** Submit a select and wait for its reply (`SelectResult` or `SelectFailure`). */
  async select(parent: string | LiveHandle, candidates: string[], winner: string,
               options: MergeOptions & Timed): Promise<SelectReply> {
    const { timeout, ...rest } = options;
    return this.runRequest(this.selectRequest(parent, candidates, winner, rest), timeout ?? 10);
  }

  /** A request built already: subscribed first, then enqueued, then its reply awaited, within `timeout` seconds. */
  async runRequest<R extends AnyRequest>(request: R, timeout: number): Promise<ReplyOf<R>> {
    const seconds = waitBound(timeout);
    const [requestId, call] = this.job(request);
    const channel = request.replyTo ?? this.options.replyChannel;
    const deadline = Date.now() + seconds * 1000;
    const enqueue = () => again(() => this.scripts.enqueue(...call), deadline);
    const work = this.answer(requestId, request, channel, deadline, seconds, enqueue);
    return this.bounded(requestId, seconds, deadline, work) as Promise<ReplyOf<R>>;
  }

  /** Drop the subscription and, for a client of `fromUrl`, the connection. */
  async close(): Promise<void> {
    const subscriber = this.subscriber;
    this.subscriber = undefined;
    this.subscribed.clear();
    subscriber?.disconnect();
    if (this.owned) this.redis.disconnect();
  }

  // -- internals ----------------------------------------------------------------------------------

  private job(request: AnyRequest): [string, [string[], (string | number)[]]] {
    if (request === null || typeof request !== "object") {
      throw invalid("expected a request, as the client's request(), mergeRequest() or selectRequest() builds");
    }
    const requestId = checkRequestId(request.requestId);
    let payload: string;
    try {
      payload = JSON.stringify(request);
    } catch (error) {
      throw invalid(`request ${requestId} cannot be sent as JSON: ${String(error)}`);
    }
    const size = Buffer.byteLength(payload, "utf8");
    if (size > REQUEST_LIMIT) throw invalid(`request is ${size} bytes, over the limit of ${REQUEST_LIMIT}`);
    const now = stamp(new Date());
    const o = this.options;
    const fields: (string | number)[] = [
      "created_at", now, "success_callback_name", "", "failure_callback_name", "", "stopped_callback_name", "",
      "started_at", "", "ended_at", "", "last_heartbeat", "", "worker_name", "", "group_id", "",
      ...(o.retries ? ["retries_left", o.retries, "retry_intervals", "[0]"] : []),
      "origin", o.queue, "description", JOB_FUNCTION, "enqueued_at", now, "timeout", o.jobTimeout,
      "result_ttl", o.jobTtl, "failure_ttl", o.outcomeTtl, "status", "queued",
    ];
    const keys = [`rq:job:${requestId}`, `rq:queue:${o.queue}`, `sf:req:${requestId}`, "rq:queues"];
    return [requestId, [keys, [requestId, payload, ...fields]]];
  }

  private bounded(requestId: string, seconds: number, deadline: number, work: Promise<Outcome>): Promise<Outcome> {
    return cut(deadline + HARD_AFTER * 1000, noReply(requestId, seconds), work);
  }

  /**
   * The stored outcome's verdict for `asked` (null: a wait by id alone), read until it answers: once
   * the subscription is confirmed, after each wake-up, `recheckEvery` seconds without news, and once
   * more at the deadline. With `enqueue`, it is run once the waiter listens (its -1: a conflict; its
   * 1, a new request: its reply is announced to the subscription, so no first read).
   */
  private async answer(requestId: string, asked: AnyRequest | null, channel: string, deadline: number,
                       seconds: number, enqueue?: () => Promise<number>): Promise<Outcome> {
    let woken = false;
    let wake: () => void = () => { woken = true; };
    const waiter: Waiter = { wake: () => wake() };
    const set = this.waiters.get(requestId) ?? new Set<Waiter>();
    this.waiters.set(requestId, set.add(waiter));
    try {
      let listening = true;
      try {
        await this.listen(channel, deadline);
      } catch (error) {
        if (!(error instanceof TimeoutError)) throw error;
        listening = false; // not subscribed by the deadline: enqueued all the same, then a last look
      }
      let read = true;
      if (enqueue) {
        const enqueued = await enqueue();
        if (enqueued === -1 && asked) return conflict(requestId, opOf(asked));
        read = !listening || enqueued !== 1;
      }
      for (; Date.now() < deadline;) {
        if (read || woken) {
          woken = false;
          const found = await this.read(requestId, asked, deadline);
          if (found) return found;
        }
        read = true;
        const left = deadline - Date.now();
        if (left <= 0) break;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, Math.min(left, this.options.recheckEvery * 1000));
          wake = () => { clearTimeout(timer); woken = true; resolve(); };
          if (woken) wake();
        });
        wake = () => { woken = true; };
      }
      const last = await this.read(requestId, asked, deadline + HARD_AFTER * 1000);
      if (last) return last;
      throw new TimeoutError(noReply(requestId, seconds));
    } finally {
      set.delete(waiter);
      if (set.size === 0) this.waiters.delete(requestId);
    }
  }

  private async read(requestId: string, asked: AnyRequest | null, deadline: number): Promise<Outcome | null> {
    const record = `sf:req:${requestId}`;
    const [text, stored] = await again(() => this.scripts.outcome(record, ["HGET", record, "request"]), deadline);
    if (asked && typeof stored === "string" && !sameRequest(identity(asked), stored)) {
      return conflict(requestId, opOf(asked));
    }
    if (text === null) return null;
    const reply = JSON.parse(text) as Outcome;
    return reply.requestId === requestId ? reply : null;
  }

  /** Subscribed to `channel`, confirmed by the server; a reconnection wakes every waiter (replies may have been missed). */
  private async listen(channel: string, deadline: number): Promise<void> {
    if (!this.subscriber) {
      const subscriber = this.redis.duplicate();
      subscriber.on("message", (_channel: string, message: string) => this.route(message));
      subscriber.on("ready", () => { for (const set of this.waiters.values()) for (const w of set) w.wake(); });
      subscriber.on("error", () => undefined); // reconnected by ioredis; the waits read again then
      this.subscriber = subscriber;
    }
    let confirmed = this.subscribed.get(channel);
    if (!confirmed) {
      confirmed = this.subscriber.subscribe(channel).then(() => undefined);
      this.subscribed.set(channel, confirmed);
      confirmed.catch(() => this.subscribed.delete(channel));
    }
    await cut(deadline, `not subscribed to ${channel} in time`, confirmed);
  }

  /** A message on a reply channel: wake the waiters of the request id it names (never an answer). */
  private route(message: string): void {
    let requestId: unknown;
    try {
      requestId = (JSON.parse(message) as { requestId?: unknown })?.requestId;
    } catch {
      return; // anyone may publish on a channel: not a reply
    }
    if (typeof requestId !== "string") return;
    for (const waiter of this.waiters.get(requestId) ?? []) waiter.wake();
  }
}

function opOf(request: AnyRequest): "fork" | "merge" | "select" {
  return "op" in request && (request.op === "merge" || request.op === "select") ? request.op : "fork";
}

function noReply(requestId: string, seconds: number): string {
  return `no reply to request ${requestId} within ${Math.max(seconds, 0)}s`;
}
