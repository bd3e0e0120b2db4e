-- Store a session's seed by value (its references resolved): the same events, so any reader sees
-- the same log; from now on its children's one reference to it is never more than one level deep.
-- KEYS[1] = sf:s:{<id>}   (one slot)
-- ARGV[1] = the seed JSON with no reference left
-- Returns 1 when stored, 0 when the record has no seed (never created, or gone for good).
if redis.call('HEXISTS', KEYS[1], 'seed') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'seed', ARGV[1])
return 1
