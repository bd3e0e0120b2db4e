// The TypeScript client against a real server and a real sessionfork worker, both started by
// tests/integrations/test_typescript_client.py: REDIS_URL is the server (its enqueue library loaded),
// SF_SCHEDULER_URL the same server as the sf-scheduler ACL user, SF_SOURCE a session with one completed
// turn (2 events). Each test forks its own sessions from it, so the tests share nothing else.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { createServer } from "node:net";
import { after, before, test } from "node:test";
import { Redis } from "ioredis";
import { Client, ENQUEUE, ForkError, TimeoutError, VERSIONED } from "../dist/index.js";

const url = process.env.REDIS_URL;
const schedulerUrl = process.env.SF_SCHEDULER_URL;
const SOURCE = process.env.SF_SOURCE;
assert.ok(url && schedulerUrl && SOURCE, "REDIS_URL, SF_SCHEDULER_URL and SF_SOURCE are set by the Python test");

let client;
let redis;
let n = 0;
const unique = (what) => `${what}-${process.pid}-${Date.now()}-${++n}`;
const turn = (text) => [{ type: "turn/start", data: {} }, { type: "assistant/message", data: { text } },
  { type: "turn/end", data: { reason: "completed" } }];

before(() => {
  client = Client.fromUrl(url);
  redis = new Redis(url);
});

after(async () => {
  await client.close();
  redis.disconnect();
});

/** A fresh session forked from SF_SOURCE: its own parent for merges and selects. */
async function freshParent() {
  const reply = await client.fork(SOURCE, { sessionId: unique("parent"), timeout: 10 });
  assert.equal(reply.ok, true, JSON.stringify(reply));
  return reply.session.id;
}

test("fork answers the child's header", async () => {
  const child = unique("child");
  const reply = await client.fork(SOURCE, { sessionId: child, timeout: 10 });
  assert.equal(reply.type, "fork/result");
  assert.equal(reply.ok, true);
  assert.equal(reply.session.id, child);
  assert.equal(reply.session.parentSession, SOURCE);
  assert.equal(reply.session.seedLength, 2);
});

/** Wait until `check()` holds (polled; it may be async), at most `seconds`: a condition with a deadline, not a sleep. */
async function until(check, seconds, what) {
  const deadline = Date.now() + seconds * 1000;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

const ENQUEUE_SHA = createHash("sha1").update(ENQUEUE, "utf8").digest("hex");

for (const [enqueue, as, used, unused] of [["auto", "the sf-scheduler role", "FCALL", "EVALSHA"],
  ["fcall", "the sf-scheduler role", "FCALL", "EVALSHA"], ["eval", "the default user", "EVALSHA", "FCALL"]]) {
  test(`enqueue "${enqueue}" enqueues with ${used} and reads the reply, as ${as}`, async () => {
    const other = Client.fromUrl(as === "the default user" ? url : schedulerUrl, { enqueue });
    const base = new Redis(url);
    const feed = await base.monitor();
    const sent = [];   // the enqueue script's calls, as the server ran them
    feed.on("monitor", (_time, args) => {
      if ((args[0] === "FCALL" && args[1] === VERSIONED) || (args[0] === "EVALSHA" && args[1] === ENQUEUE_SHA)) {
        sent.push(args);
      }
    });
    try {
      const sessionId = unique(`route-${enqueue}`);
      const reply = await other.fork(SOURCE, { sessionId, timeout: 10 });
      assert.equal(reply.ok, true, JSON.stringify(reply));
      assert.equal(reply.session.id, sessionId);
      await until(() => sent.length > 0, 5, "the enqueue in the server's MONITOR feed");
      assert.deepEqual([...new Set(sent.map((args) => args[0]))], [used], JSON.stringify(sent));  // NOSCRIPT: sent again
      assert.ok(!sent.some((args) => args[0] === unused));
    } finally {
      feed.disconnect();
      base.disconnect();
      await other.close();
    }
  });
}

test("a request submitted twice forks once and both answer the first outcome", async () => {
  const childrenOf = `sf:s:{${SOURCE}}:children`;
  const before = await redis.scard(childrenOf);
  const request = client.request(SOURCE, { count: 2 });
  const [first, second] = await Promise.all([client.submit(request), client.submit(request)]);
  assert.equal(first, request.requestId);
  assert.equal(second, request.requestId);
  const reply = await client.wait(request, 10);
  assert.equal(reply.ok, true);
  assert.equal(reply.sessions.length, 2);
  assert.deepEqual(await client.wait(request, 10), reply);
  const rerun = await client.runRequest({ ...request }, 10);   // the same request again: no new children
  assert.deepEqual(rerun, reply);
  assert.equal(await redis.scard(childrenOf), before + 2);   // two children: forked once
  const children = await redis.smembers(childrenOf);
  for (const header of reply.sessions) assert.ok(children.includes(header.id), header.id);
});

test("a request id used for another request answers IDEMPOTENCY_CONFLICT, by fork and by wait", async () => {
  const requestId = unique("req");
  const first = await client.fork(SOURCE, { requestId, sessionId: unique("one"), timeout: 10 });
  assert.equal(first.ok, true);
  const other = await client.fork(SOURCE, { requestId, sessionId: unique("two"), timeout: 10 });
  assert.equal(other.ok, false);
  assert.equal(other.type, "fork/error");
  assert.equal(other.code, "IDEMPOTENCY_CONFLICT");
  assert.equal(other.message, `request id "${requestId}" was already used for a different request`);
  const stale = client.request(SOURCE, { requestId, sessionId: unique("three") });
  assert.equal(await client.submit(stale), requestId);
  assert.equal((await client.wait(stale, 10)).code, "IDEMPOTENCY_CONFLICT");
  assert.deepEqual(await client.wait(requestId, 10), first);   // by id alone: the id's one outcome
  const same = client.request(SOURCE, { requestId, sessionId: first.session.id });
  assert.deepEqual(await client.wait(same, 10), first);        // key order and the reply channel aside, the same
});

test("a fork's failures come back typed, with their codes and messages", async () => {
  const missing = await client.fork(unique("nobody"), { timeout: 10 });
  assert.equal(missing.ok, false);
  assert.equal(missing.code, "SESSION_NOT_FOUND");
  const busy = await client.fork(SOURCE, { sessionId: unique("busy"), timeout: 10,
    edits: [{ type: "turn/start", data: {} }, { type: "tool/call", data: { id: "t1" } }] });
  assert.equal(busy.ok, true);
  const open = await client.fork(busy.session.id, { timeout: 10 });
  assert.equal(open.code, "OPEN_TURN");
  assert.equal(open.message, `cannot fork session "${busy.session.id}" inside an open turn (last event: tool/call)`);
});

test("merge brings a branch's turn back, exactly once", async () => {
  const parent = await freshParent();
  const branch = await client.fork(parent, { sessionId: unique("branch"), edits: turn("found it"), timeout: 10 });
  assert.equal(branch.ok, true);
  const merged = await client.merge(parent, branch.session.id, { mode: "events", timeout: 10 });
  assert.equal(merged.type, "merge/result", JSON.stringify(merged));
  assert.equal(merged.ok, true);
  assert.deepEqual(merged.mergedFrom, { session: branch.session.id, fromSeq: 2, toSeq: 4 });
  assert.equal(merged.fromSeq, 2);
  assert.equal(merged.length, 2 + 3 + 3);
  const again = await client.merge(parent, branch.session.id, { mode: "summary", summary: { text: "again" }, timeout: 10 });
  assert.equal(again.ok, false);
  assert.equal(again.type, "merge/error");
  assert.equal(again.code, "ALREADY_MERGED");
});

test("select merges the winner and abandons the other candidates", async () => {
  const parent = await freshParent();
  const ids = [unique("t0"), unique("t1"), unique("t2")];
  const fan = await client.fork(parent, { timeout: 10,
    variants: ids.map((sessionId, i) => ({ sessionId, edits: turn(`answer ${i}`) })) });
  assert.equal(fan.ok, true, JSON.stringify(fan));
  const picked = await client.select(parent, ids, ids[1], { mode: "summary", summary: { text: "t1 won" }, timeout: 10 });
  assert.equal(picked.type, "select/result", JSON.stringify(picked));
  assert.equal(picked.winner, ids[1]);
  assert.deepEqual(picked.abandoned, [ids[0], ids[2]]);
  const stale = await client.select(parent, ids, ids[0], { mode: "events", timeout: 10 });
  assert.equal(stale.code, "ALREADY_MERGED");
});

test("a wait reads the stored outcome again once its subscription reconnects", async () => {
  const name = unique("reconnecting");
  const waiter = Client.fromUrl(url, { recheckEvery: 60 }, { connectionName: name });
  try {
    const channel = unique("ts-replies");
    const request = waiter.request(SOURCE, { sessionId: unique("reconnected"), replyTo: channel });
    const started = Date.now();
    const waiting = waiter.wait(request, 30);     // subscribed to a channel of its own: nothing stored yet
    await until(async () => (await redis.call("PUBSUB", "NUMSUB", channel))[1] === 1, 5, "the waiter's subscription");
    // The same request, announced on another channel: the waiter's subscription never hears of it.
    const reply = await client.runRequest({ ...request, replyTo: unique("elsewhere") }, 10);
    assert.equal(reply.ok, true, JSON.stringify(reply));
    const clients = String(await redis.call("CLIENT", "LIST")).split("\n").filter((l) => l.includes(` name=${name} `));
    assert.equal(clients.length, 2, clients.join("\n"));   // its commands' connection and its subscription
    for (const line of clients) await redis.call("CLIENT", "KILL", "ID", line.match(/^id=(\d+)/)[1]);
    assert.deepEqual(await waiting, reply);         // read again on reconnecting, long before its recheck
    assert.ok(Date.now() - started < 20000, `answered after ${Date.now() - started} ms`);
  } finally {
    await waiter.close();
  }
});

test("bad input is refused before anything is sent", async () => {
  await assert.rejects(client.fork(SOURCE, { requestId: "not an id" }), (e) => e instanceof ForkError && e.code === "INVALID_REQUEST");
  for (const timeout of [-1, Number.NaN, Infinity, 86401, "5"]) {
    await assert.rejects(client.wait("req-x", timeout), (e) => e instanceof ForkError && e.code === "INVALID_REQUEST");
  }
  const huge = client.request(SOURCE, { edits: [{ type: "note", data: "x".repeat(70000) }] });
  await assert.rejects(client.submit(huge), (e) => e instanceof ForkError && /over the limit of 65536/.test(e.message));
  assert.throws(() => client.mergeRequest(SOURCE, "c", { mode: "summary" }), ForkError);
  assert.throws(() => client.selectRequest(SOURCE, ["a"], "b", { mode: "events" }), ForkError);
  assert.equal(await redis.exists(`rq:job:${huge.requestId}`), 0);
});

test("a wait ends at its deadline, and a published message is never the answer", async () => {
  const requestId = unique("never");
  const spoof = setInterval(() => {
    redis.publish("sf:replies", JSON.stringify({ type: "fork/result", requestId, ok: true, session: { id: "fake" } }));
  }, 50);
  const started = Date.now();
  try {
    await assert.rejects(client.wait(requestId, 0.8), (e) => e instanceof TimeoutError);
  } finally {
    clearInterval(spoof);
  }
  const took = Date.now() - started;
  assert.ok(took >= 750 && took < 1300 + 500, `waited ${took} ms`);
});

test("calls to a server that never answers end by their deadlines", async () => {
  const sockets = [];
  const silent = createServer((socket) => { sockets.push(socket); });   // accepts, never replies
  await new Promise((resolve) => silent.listen(0, "127.0.0.1", resolve));
  const frozen = Client.fromUrl(`redis://127.0.0.1:${silent.address().port}/0`);
  try {
    let started = Date.now();
    await assert.rejects(frozen.fork("s", { timeout: 0.5 }), (e) => e instanceof TimeoutError);
    let took = Date.now() - started;
    assert.ok(took < 500 + 500 + 300, `fork took ${took} ms`);
    started = Date.now();
    await assert.rejects(frozen.submit(frozen.request("s")), (e) => e instanceof TimeoutError && /not enqueued within 10s/.test(e.message));
    took = Date.now() - started;
    assert.ok(took >= 9900 && took < 10500 + 300, `submit took ${took} ms`);
    assert.ok(sockets.length >= 1, "the client reached the silent server");
  } finally {
    await frozen.close();
    for (const socket of sockets) socket.destroy();
    silent.close();
  }
});

test("the TypeScript page's example runs and prints what the page promises", async () => {
  const { readFileSync, writeFileSync } = await import("node:fs");
  const { execFileSync } = await import("node:child_process");
  const page = readFileSync(new URL("../../docs/typescript.md", import.meta.url), "utf8");
  const blocks = [...page.matchAll(/^```ts\n([\s\S]*?)^```/gm)].map((m) => m[1]);
  assert.equal(blocks.length, 1);
  assert.ok(blocks[0].includes("redis://localhost:6379/0"));
  const example = new URL("../.docs-example.mjs", import.meta.url);   // in the package: "sessionfork" is itself
  writeFileSync(example, blocks[0].replaceAll("redis://localhost:6379/0", url));
  const out = execFileSync(process.execPath, [example.pathname], { env: { ...process.env, SOURCE }, timeout: 60000 })
    .toString();
  assert.deepEqual(out.trim().split("\n"), ["forked true", "variants true 3", "picked true 2", "refused ALREADY_MERGED",
    "fan-out 2", "conflict IDEMPOTENCY_CONFLICT"]);
  for (const line of out.trim().split("\n")) assert.ok(page.includes(`\`${line}\``), line);
});
