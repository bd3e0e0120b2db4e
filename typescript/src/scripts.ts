// The shipped Lua of the Python package (copied into dist/lua by the build: one source), and the
// route that runs it: FCALL of the loaded library while it serves, EVALSHA otherwise.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import type { Redis } from "ioredis";

function shipped(name: string): string {
  return readFileSync(new URL(`./lua/${name}`, import.meta.url), "utf8");
}

const sha1 = (text: string): string => createHash("sha1").update(text, "utf8").digest("hex");

/** The enqueue script (`sessionfork/protocol/scripts/enqueue.lua`). */
export const ENQUEUE = shipped("enqueue.lua");
/** The outcome read (`sessionfork/protocol/scripts/outcome.lua`). */
export const OUTCOME = shipped("outcome.lua");
const ENQUEUE_SHA = sha1(ENQUEUE);
const OUTCOME_SHA = sha1(OUTCOME);
/** The library's enqueue function under a name of this script's text (an older library is "not found"). */
export const VERSIONED = `sf_enqueue_${ENQUEUE_SHA.slice(0, 12)}`;
const OUTCOME_FUNCTION = "sf_outcome";

/** How the enqueue runs: `auto` FCALL while this release's library serves, else EVALSHA; `fcall`; `eval`. */
export type EnqueueMode = "auto" | "fcall" | "eval";

function unserved(error: unknown): boolean {
  const text = String((error as Error)?.message ?? error).toLowerCase();
  return text.includes("function not found") || text.startsWith("noperm");
}

function replyError(error: unknown): boolean {
  return error instanceof Error && error.name === "ReplyError";
}

/** The scripts of one queue server, run on one route (shared by a client's calls). */
export class Scripts {
  private fcall: boolean;

  constructor(private readonly redis: Redis, private readonly mode: EnqueueMode) {
    if (!["auto", "fcall", "eval"].includes(mode)) {
      throw new RangeError(`enqueue mode must be one of auto, fcall, eval, got ${String(mode)}`);
    }
    this.fcall = mode !== "eval";
  }

  /** The enqueue script's answer: 1 enqueued, 0 the same request queued or done, -1 the id used for another. */
  async enqueue(keys: string[], args: (string | number)[]): Promise<number> {
    const answer = await this.run(
      () => ["FCALL", VERSIONED, keys.length, ...keys, ...args],
      () => ["EVALSHA", ENQUEUE_SHA, keys.length, ...keys, ...args],
      ENQUEUE,
    );
    return Number(answer);
  }

  /** The reply JSON stored for `record` (`sf:req:<id>`), null while none is; with `also`, that command's answer too, in the same round trip. */
  async outcome(record: string, also: (string | number)[]): Promise<[string | null, unknown]> {
    const answer = (await this.run(
      () => ["FCALL", OUTCOME_FUNCTION, 1, record],  // FCALL: what the sf-scheduler ACL role may run
      () => ["EVALSHA", OUTCOME_SHA, 1, record],
      OUTCOME,
      also,
    )) as [unknown, unknown];
    const [text, other] = answer;
    return [text == null ? null : String(text), other];
  }

  private async run(
    viaFunction: () => (string | number)[],
    viaScript: () => (string | number)[],
    source: string,
    also?: (string | number)[],
  ): Promise<unknown> {
    for (let attempt = 0; ; attempt++) {
      const sentFunction = this.fcall;
      const command = sentFunction ? viaFunction() : viaScript();
      const pipeline = this.redis.pipeline();
      pipeline.call(String(command[0]), ...command.slice(1));
      if (also) pipeline.call(String(also[0]), ...also.slice(1));
      const results = (await pipeline.exec()) ?? [];
      const [error, value] = results[0] ?? [new Error("no reply"), null];
      if (also) {
        const [otherError] = results[1] ?? [null];
        if (otherError) throw otherError;
      }
      if (!error) return also ? [value, results[1]?.[1]] : value;
      if (attempt >= 2 || !replyError(error)) throw error;
      const text = error.message;
      if (sentFunction && unserved(error)) {
        if (this.mode === "fcall") {
          throw new Error(`${text} (load the enqueue library: sessionfork load-functions)`);
        }
        this.fcall = false; // this release's library is not loaded: EVALSHA from now on
      } else if (text.startsWith("NOSCRIPT")) {
        await this.redis.call("SCRIPT", "LOAD", source);
      } else if (text.startsWith("NOPERM")) {
        this.fcall = this.mode !== "eval";
        throw new Error(`${text} (is the enqueue library loaded? sessionfork load-functions)`);
      } else {
        throw error;
      }
    }
  }
}
