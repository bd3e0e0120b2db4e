-- Write an imported session's record: the last step of a session's import (its own log, turn
-- index, merges index and pins are written before it), so the record's existence is the session's.
-- KEYS[1] = sf:s:{<id>}   (one slot)
-- ARGV    = the bundle's digest, then the record's fields as name, value, ...
-- Returns 1 when written now, 0 when this bundle's import wrote it already (field "imported" is the
-- digest: a resumed import), -1 when the id is taken (a session, a tombstone, another import).
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'imported') == ARGV[1] then return 0 end
  return -1
end
redis.call('HSET', KEYS[1], 'imported', ARGV[1], unpack(ARGV, 2))
return 1
