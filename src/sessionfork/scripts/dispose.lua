-- End a session's live incarnation; its header and events stay readable.
-- KEYS[1] = sf:s:{<id>}   (one slot)
-- ARGV[1] = instance token ("" = any live instance)
-- Returns 1 when disposed now, -1 when not live, -2 on a stale token.
local inst = redis.call('HGET', KEYS[1], 'instance')
if not inst then return -1 end
if ARGV[1] ~= '' and inst ~= ARGV[1] then return -2 end
redis.call('HDEL', KEYS[1], 'instance')
return 1
