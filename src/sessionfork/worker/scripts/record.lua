-- Store a request's outcome once, then notify: append it to the outcome stream and PUBLISH it.
-- The stream entry's field names are protocol.outcomes.STREAM_FIELDS (pinned equal by a test).
-- All in one script, so a stored outcome is always announced and never announced twice.
-- KEYS[1] = sf:req:<request id>, KEYS[2] = sf:outcomes   (queue server)
-- ARGV    = outcome JSON (streamed and published), reply channel, TTL seconds, stream MAXLEN, digest
--           ("" = keep), request id, code ("OK" or an error code), run time and enqueue-to-outcome
--           latency in microseconds (0: unknown), the names of the fields that hold a stored outcome
--           (space-separated: core.records.STORED_OUTCOME), then the fields to store, as name,
--           value, ... (core.records.outcome_fields: "outcome" and the JSON, or a one-child
--           outcome's compact fields "child", "header", "cwd"?, "parent"?)
-- Returns {1} when stored now ({1, error} when the PUBLISH was refused), {0, the named fields'
-- values} when an outcome was stored before (the first one stands).
local names = {}
for name in string.gmatch(ARGV[10], '%S+') do names[#names + 1] = name end
local before = redis.call('HMGET', KEYS[1], unpack(names))
for i = 1, #names do
  if before[i] then
    table.insert(before, 1, 0)
    return before
  end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 11))
if ARGV[5] ~= '' then redis.call('HSETNX', KEYS[1], 'digest', ARGV[5]) end
-- Once the outcome is stored, the plan and the snapshot are never read again: free them.
redis.call('HDEL', KEYS[1], 'snapshot', 'children')
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*',
  'requestId', ARGV[6], 'code', ARGV[7], 'durationUs', ARGV[8], 'latencyUs', ARGV[9], 'reply', ARGV[1])
-- A channel the ACL user may not publish on (a request's replyTo) must not fail the request: the
-- outcome is stored and streamed; the refusal is returned for the worker to log (pcall).
local published = redis.pcall('PUBLISH', ARGV[2], ARGV[1])
if type(published) == 'table' and published.err then return {1, published.err} end
return {1}
