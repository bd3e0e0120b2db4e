-- Claim a request id before any effect: the first claim plans the children, later ones resume.
-- KEYS[1] = sf:req:<request id>   (queue server)
-- ARGV    = digest of the request, planned child ids (JSON), TTL seconds, the request's identity
--           (the digest's JSON preimage: what any-language producers' enqueue.lua compares)
-- Returns {"NEW", children} | {"RESUME", children, snapshot or ""} | {"DONE", outcome} | {"CONFLICT"}
local r = redis.call('HMGET', KEYS[1], 'digest', 'children', 'outcome', 'snapshot')
if r[1] and r[1] ~= ARGV[1] then return {'CONFLICT'} end
if r[3] then return {'DONE', r[3]} end
if not r[1] then
  redis.call('HSET', KEYS[1], 'digest', ARGV[1], 'children', ARGV[2], 'request', ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return {'NEW', ARGV[2]}
end
return {'RESUME', r[2], r[4] or ''}
