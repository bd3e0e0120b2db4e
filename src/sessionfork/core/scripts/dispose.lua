-- End a session's live incarnation; its header and events stay readable.
-- KEYS[1] = sf:s:{<id>}
-- KEYS[2] = sf:lifecycle, KEYS[3] = sf:disposed (the retention index)
--           (optional: given only when they share the server, i.e. not on a cluster)
-- ARGV    = instance token ("" = any live instance), lifecycle stream MAXLEN, session id, now (ms)
-- Returns 1 when disposed now, -1 when not live, -2 on a stale token.
local r = redis.call('HMGET', KEYS[1], 'instance', 'len')
if not r[1] then return -1 end
if ARGV[1] ~= '' and r[1] ~= ARGV[1] then return -2 end
redis.call('HDEL', KEYS[1], 'instance')
if KEYS[2] then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'type', 'session/disposed', 'id', ARGV[3], 'len', r[2])
end
if KEYS[3] then
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
end
return 1
