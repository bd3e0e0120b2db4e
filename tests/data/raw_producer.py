"""A producer in "any language": only raw Redis commands, no rq or sessionfork import.

Usage: python raw_producer.py PORT[,PORT...] SOURCE CHILD REQUEST_ID [RESULT_TTL [BOUNDARY]]  -> prints the reply.
It follows the README's "Any-language enqueue" recipe step by step; ENQUEUE is the README's script
(``src/sessionfork/queue/scripts/enqueue.lua``, a test checks they are the same text). Several
ports: a sharded queue, the servers in shard order; the request goes to (and is awaited on) the
shard the recipe's routing function names, computed here without sessionfork.
"""

import json
import sys
import time
import zlib

import redis


def shard_of(request_id: str, n: int) -> int:
    """Step 0 of the recipe: jump consistent hash of the CRC-32 of the id's UTF-8 bytes."""
    key, b, j = zlib.crc32(request_id.encode("utf-8")), -1, 0
    while j < n:
        b = j
        key = (key * 2862933555777941757 + 1) % 2**64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


ports, source, child, request_id = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
result_ttl = sys.argv[5] if len(sys.argv) > 5 else "604800"
r = redis.Redis(port=int(ports[shard_of(request_id, len(ports))]))
fields = {"requestId": request_id, "source": source, "sessionId": child}
if len(sys.argv) > 6:
    fields["boundary"] = int(sys.argv[6])  # fork at this event seq (an integer)
request = json.dumps(fields)
now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())

ENQUEUE = """-- Enqueue a fork request as an RQ job, once per request id, from any language (the README's
-- any-language recipe; the asyncio client enqueues with it too).
-- KEYS[1] = rq:job:<request id>, KEYS[2] = rq:queue:<queue>, KEYS[3] = sf:req:<request id>,
-- KEYS[4] (optional) = rq:queues, the set of queue keys RQ lists (rq info, rq-dashboard)
-- ARGV    = request id, request JSON, then the job hash's other fields and values
--           (origin, status, created_at, enqueued_at, timeout, retries_left, result_ttl, ...);
--           without a "data" field, data is the JSON job [sessionfork.jobs.fork, null, [request], {}]
-- Returns  1 enqueued;
--          0 the same request (same source, children and boundary; replyTo may differ) is queued
--            or done: its one outcome answers this submission too;
--         -1 the request id was used for a different request: IDEMPOTENCY_CONFLICT, nothing
--            enqueued (and nothing will be announced for this submission).
local function same(a, b)
  if a == cjson.null then a = nil end
  if b == cjson.null then b = nil end
  if type(a) ~= 'table' or type(b) ~= 'table' then return a == b end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k, v in pairs(b) do if a[k] == nil and v ~= cjson.null then return false end end
  return true
end
local function identity(request)  -- what makes two requests "the same": source, children, boundary
  local ok, r = pcall(cjson.decode, request)
  if not ok or type(r) ~= 'table' then return nil end
  return {r['source'] or cjson.null, r['sessionId'] or cjson.null, r['count'] or cjson.null,
          r['sessionIds'] or cjson.null, r['boundary'] or cjson.null}
end
local function differs(first)
  local mine = identity(ARGV[2])
  if first == nil or mine == nil then return false end  -- unknown: the first request's outcome answers
  for i = 1, 5 do if not same(first[i], mine[i]) then return true end end
  return false
end
local stored = redis.call('HMGET', KEYS[3], 'request')[1]  -- kept by the worker when it claims the id
if stored then
  local ok, first = pcall(cjson.decode, stored)
  if ok and differs(first) then return -1 end
  return 0
end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end  -- refused, or claimed before ids were kept
local data = redis.call('HMGET', KEYS[1], 'data')[1]
if data then  -- queued, not claimed yet: compare with the queued job's request (when it is plain JSON)
  local ok, job = pcall(cjson.decode, data)
  if ok and type(job) == 'table' and type(job[3]) == 'table' and type(job[3][1]) == 'string'
      and differs(identity(job[3][1])) then
    return -1
  end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local has_data = false
for i = 3, #ARGV, 2 do if ARGV[i] == 'data' then has_data = true end end
if not has_data then
  redis.call('HSET', KEYS[1], 'data', cjson.encode({'sessionfork.jobs.fork', cjson.null, {ARGV[2]}, {}}))
end
if #ARGV >= 4 then redis.call('HSET', KEYS[1], unpack(ARGV, 3)) end
redis.call('RPUSH', KEYS[2], ARGV[1])
if KEYS[4] then redis.call('SADD', KEYS[4], KEYS[2]) end
return 1
"""

# 1. Subscribe to the reply channel first, so no reply can slip by.
pubsub = r.pubsub(ignore_subscribe_messages=True)
pubsub.subscribe("sf:replies")
# 2. Enqueue atomically, once per request id; -1: the id was used for a different request.
enqueued = r.execute_command(
    "EVAL", ENQUEUE, 3, f"rq:job:{request_id}", "rq:queue:sessionfork", f"sf:req:{request_id}",
    request_id, request, "origin", "sessionfork", "status", "queued", "created_at", now, "enqueued_at", now,
    "timeout", "30", "retries_left", "3", "result_ttl", result_ttl, "failure_ttl", "604800",
    "description", "sessionfork.jobs.fork",
)
if enqueued == -1:
    print(json.dumps({"type": "fork/error", "requestId": request_id, "ok": False, "code": "IDEMPOTENCY_CONFLICT",
                      "message": f'request id "{request_id}" was already used for a different request'}))
    sys.exit(0)
# 3. The reply is the outcome stored under the request id; a message naming the request only says
#    "read it now" (anyone may publish on a channel: a message is never the answer).
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    stored = r.execute_command("HGET", f"sf:req:{request_id}", "outcome")
    if stored:
        print(stored.decode())
        sys.exit(0)
    message = pubsub.get_message(timeout=0.5)
    if message:
        try:
            reply = json.loads(message["data"])
        except ValueError:
            continue  # anyone may publish on a channel: not a reply
        if isinstance(reply, dict) and reply.get("requestId") == request_id:
            continue  # woken: the stored outcome is read at the top of the loop
sys.exit("no reply")
