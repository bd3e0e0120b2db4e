-- Claim request ids before any effect: the first claim of an id plans its children, later ones
-- resume. One call claims one request, or every request of a batch, in order (an id twice: the
-- second claim sees the first).
-- KEYS    = sf:req:<request id>, one per request   (queue server)
-- ARGV    = TTL seconds, the names of the fields that hold a stored outcome (space-separated, the
--           first "outcome": core.records.STORED_OUTCOME), then for each key in order: digest of
--           the request, planned child ids (JSON), the request's identity (the digest's JSON
--           preimage: what any-language producers' enqueue.lua compares)
-- Returns each key's claim, in order: {"NEW"} (the children planned are the caller's own: not sent
-- back) | {"RESUME", children, snapshot or ""} |
-- {"DONE", the named fields' values} | {"CONFLICT"}
local names = {}
for name in string.gmatch(ARGV[2], '%S+') do names[#names + 1] = name end
local out = {}
for k = 1, #KEYS do
  local at = 3 * k
  local digest, children = ARGV[at], ARGV[at + 1]
  local r = redis.call('HMGET', KEYS[k], 'digest', 'children', 'snapshot', unpack(names))
  local done = false
  for i = 4, #names + 3 do
    if r[i] then done = true end
  end
  if r[1] and r[1] ~= digest then
    out[k] = {'CONFLICT'}
  elseif done then
    out[k] = {'DONE', unpack(r, 4, #names + 3)}
  elseif not r[1] then
    redis.call('HSET', KEYS[k], 'digest', digest, 'children', children, 'request', ARGV[at + 2])
    redis.call('EXPIRE', KEYS[k], ARGV[1])
    out[k] = {'NEW'}
  else
    out[k] = {'RESUME', r[2], r[3] or ''}
  end
end
return out
