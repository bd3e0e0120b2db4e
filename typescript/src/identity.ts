// What makes two requests under one request id "the same" (the Python package's wire.IDENTITY_FIELDS,
// which the enqueue script lists too): compared with the identity the worker keeps in the request's
// record (`sf:req:<id>`, field `request`: a JSON array of these fields' values), object keys in any order.
import type { AnyRequest, ForkFailure, MergeFailure, SelectFailure } from "./types.js";

export const IDENTITY_FIELDS = [
  "source", "sessionId", "count", "sessionIds", "boundary", "ifLength", "edits", "variants", "summary",
  "op", "parent", "child", "mode", "range", "ifParentLength", "ifChildLength", "candidates", "winner",
] as const;
const OP = IDENTITY_FIELDS.indexOf("op");

/** The request's identity: each field's value, `null` when absent (`"op": "fork"` is a fork without op). */
export function identity(request: AnyRequest): unknown[] {
  const fields: unknown[] = IDENTITY_FIELDS.map((name) => (request as unknown as Record<string, unknown>)[name] ?? null);
  if (fields[OP] === "fork") fields[OP] = null;
  return fields;
}

function equal(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((v, i) => equal(v, b[i]));
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  const keys = Object.keys(x).filter((k) => x[k] !== undefined);
  return keys.length === Object.keys(y).length && keys.every((k) => k in y && equal(x[k], y[k]));
}

/** Whether `mine` (`identity`) is the request whose identity the record keeps (`stored`, its JSON);
 * a record that cannot be read as one leaves the outcome standing. */
export function sameRequest(mine: unknown[], stored: string): boolean {
  let theirs: unknown;
  try {
    theirs = JSON.parse(stored);
  } catch {
    return true;
  }
  if (!Array.isArray(theirs)) return true;
  return IDENTITY_FIELDS.every((_, i) => equal(mine[i] ?? null, theirs[i] ?? null));
}

/** The `IDEMPOTENCY_CONFLICT` reply of an `op` request whose id another request used. */
export function conflict(requestId: string, op: "fork" | "merge" | "select"): ForkFailure | MergeFailure | SelectFailure {
  return {
    type: `${op}/error` as ForkFailure["type"],
    requestId,
    ok: false,
    code: "IDEMPOTENCY_CONFLICT",
    message: `request id "${requestId}" was already used for a different request`,
  } as ForkFailure | MergeFailure | SelectFailure;
}
