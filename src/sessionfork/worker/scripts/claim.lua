-- Claim a request id before any effect: the first claim plans the children, later ones resume.
-- KEYS[1] = sf:req:<request id>   (queue server)
-- ARGV    = digest of the request, planned child ids (JSON), TTL seconds, the request's identity
--           (the digest's JSON preimage: what any-language producers' enqueue.lua compares), the
--           names of the fields that hold a stored outcome (space-separated, the first "outcome":
--           core.records.STORED_OUTCOME)
-- Returns {"NEW", children} | {"RESUME", children, snapshot or ""} | {"DONE", the named fields'
-- values} | {"CONFLICT"}
local names = {}
for name in string.gmatch(ARGV[5], '%S+') do names[#names + 1] = name end
local r = redis.call('HMGET', KEYS[1], 'digest', 'children', 'snapshot', unpack(names))
if r[1] and r[1] ~= ARGV[1] then return {'CONFLICT'} end
for i = 4, #names + 3 do
  if r[i] then return {'DONE', unpack(r, 4, #names + 3)} end
end
if not r[1] then
  redis.call('HSET', KEYS[1], 'digest', ARGV[1], 'children', ARGV[2], 'request', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return {'NEW', ARGV[2]}
end
return {'RESUME', r[2], r[3] or ''}
