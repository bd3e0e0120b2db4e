-- A descendant of this session is gone for good: take it out of the children index. When this
-- session is deleted and that was its last descendant, free its own log (nobody can read it now).
-- KEYS[1] = sf:s:{<id>}, KEYS[2] = sf:s:{<id>}:log, KEYS[3] = sf:s:{<id>}:children,
-- KEYS[4] = sf:s:{<id>}:turns   (one slot)
-- ARGV[1] = the id of the child that is gone
-- Returns the id of this session's parent when this session is now gone for good too (its parent
-- is released next), "" when it is but has no parent, false otherwise.
redis.call('SREM', KEYS[3], ARGV[1])
if redis.call('HEXISTS', KEYS[1], 'deleted') == 0 or redis.call('SCARD', KEYS[3]) > 0 then
  return false
end
local parent = redis.call('HGET', KEYS[1], 'parent') or ''
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('HDEL', KEYS[1], 'parent', 'seed', 'seedlen', 'lastend', 'seedend', 'summary')
return parent
