// sessionfork's TypeScript client: submit fork, merge and select requests to a sessionfork queue and
// wait for their replies, with the Python clients' idempotency and deadlines (docs/typescript.md).
export { Client, HARD_AFTER, MAX_WAIT, REQUEST_LIMIT, SUBMIT_RETRY_FOR, waitBound } from "./client.js";
export type { ClientOptions, ForkOptions, MergeOptions, Timed } from "./client.js";
export { IDENTITY_FIELDS } from "./identity.js";
export { ENQUEUE, OUTCOME, VERSIONED } from "./scripts.js";
export type { EnqueueMode } from "./scripts.js";
export * from "./types.js";
