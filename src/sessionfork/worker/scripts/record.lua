-- Store each request's outcome once, then notify: append it to the outcome stream and PUBLISH it.
-- One call records one request's outcome, or every outcome of a batch, in order.
-- The stream entry's field names are protocol.outcomes.STREAM_FIELDS (pinned equal by a test).
-- All in one script, so a stored outcome is always announced and never announced twice.
-- KEYS[1] = sf:outcomes, then sf:req:<request id>, one per outcome   (queue server)
-- ARGV    = TTL seconds, stream MAXLEN, the names of the fields that hold a stored outcome
--           (space-separated: core.records.STORED_OUTCOME), then for each outcome in order: how
--           many arguments of its own follow, then the outcome JSON (streamed and published), the
--           reply channel, digest ("" = keep), request id, code ("OK" or an error code), run time
--           and enqueue-to-outcome latency in microseconds (0: unknown), then the fields to store,
--           as name, value, ... (core.records.outcome_fields: "outcome" and the JSON, or a
--           one-child outcome's compact fields "child", "header", "cwd"?, "parent"?)
-- Returns each outcome's, in order: {1} when stored now ({1, error} when the PUBLISH was refused),
-- {0, the named fields' values} when an outcome was stored before (the first one stands).
local names = {}
for name in string.gmatch(ARGV[3], '%S+') do names[#names + 1] = name end
local out, at = {}, 4
for k = 2, #KEYS do
  local n = tonumber(ARGV[at])
  local outcome, channel, digest = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local before = redis.call('HMGET', KEYS[k], unpack(names))
  local stored = false
  for i = 1, #names do
    if before[i] then stored = true end
  end
  if stored then
    table.insert(before, 1, 0)
    out[#out + 1] = before
  else
    redis.call('HSET', KEYS[k], unpack(ARGV, at + 8, at + n))
    if digest ~= '' then redis.call('HSETNX', KEYS[k], 'digest', digest) end
    -- Once the outcome is stored, the plan and the snapshot are never read again: free them.
    redis.call('HDEL', KEYS[k], 'snapshot', 'children')
    redis.call('EXPIRE', KEYS[k], ARGV[1])
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*',
      'requestId', ARGV[at + 4], 'code', ARGV[at + 5], 'durationUs', ARGV[at + 6], 'latencyUs', ARGV[at + 7],
      'reply', outcome)
    -- A channel the ACL user may not publish on (a request's replyTo) must not fail the request:
    -- the outcome is stored and streamed; the refusal is returned for the worker to log (pcall).
    local published = redis.pcall('PUBLISH', channel, outcome)
    if type(published) == 'table' and published.err then
      out[#out + 1] = {1, published.err}
    else
      out[#out + 1] = {1}
    end
  end
  at = at + n + 1
end
return out
