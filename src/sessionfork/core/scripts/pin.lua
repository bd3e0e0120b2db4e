-- Cluster only: before a child is created, index it under its parent, unless the parent is deleted
-- (on one server create.lua does this atomically with the child). While a session is in its
-- parent's children index, the parent's log (and its ancestors') is never freed - from the child's
-- need on: a summary child reads the parent's log from its keepFrom only (the needs index).
-- KEYS[1] = sf:s:{<parent>}, KEYS[2] = sf:s:{<parent>}:children, KEYS[3] = sf:s:{<parent>}:needs
--           (one slot)
-- ARGV    = need: the first seq of the parent the children read (a summary's keepFrom; "" = 0, all),
--           then the child ids
-- Returns 1 when indexed, 0 when the parent is deleted (the fork fails SESSION_NOT_FOUND).
-- An id pinned already (a retry, or another request naming the same child id) keeps the least
-- need of its pins: whichever attempt creates the child, the entry never says more than it reads.
if redis.call('HEXISTS', KEYS[1], 'deleted') == 1 then return 0 end
for i = 2, #ARGV do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    if ARGV[1] ~= '' then redis.call('ZADD', KEYS[3], ARGV[1], ARGV[i]) end
  elseif ARGV[1] == '' then
    redis.call('ZREM', KEYS[3], ARGV[i])  -- pinned before: now it may read from 0
  else
    local had = redis.call('ZSCORE', KEYS[3], ARGV[i])  -- none: it reads from 0, and stays so
    if had and tonumber(ARGV[1]) < tonumber(had) then redis.call('ZADD', KEYS[3], ARGV[1], ARGV[i]) end
  end
end
return 1
