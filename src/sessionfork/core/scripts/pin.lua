-- Cluster only: before a child is created, index it under its parent, unless the parent is deleted
-- (on one server create.lua does this atomically with the child). While a session is in its
-- parent's children index, the parent's log (and its ancestors') is never freed.
-- KEYS[1] = sf:s:{<parent>}, KEYS[2] = sf:s:{<parent>}:children   (one slot)
-- ARGV    = the child ids
-- Returns 1 when indexed, 0 when the parent is deleted (the fork fails SESSION_NOT_FOUND).
if redis.call('HEXISTS', KEYS[1], 'deleted') == 1 then return 0 end
redis.call('SADD', KEYS[2], unpack(ARGV))
return 1
