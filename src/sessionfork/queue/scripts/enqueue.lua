-- Enqueue a fork request as an RQ job, once per request id, from any language (the README's
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
