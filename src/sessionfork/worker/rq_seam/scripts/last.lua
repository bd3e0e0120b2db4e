-- The last entry of RQ's intermediate queue with its job hash: sent right behind the dequeue's
-- BLMOVE (or LMOVE), which pushes the entry it moves there, so that a worker woken by a lone job
-- gets the job's hash in the same round trip. Another worker's move may land between the two:
-- the caller uses the hash only when the entry returned is the one it moved.
-- KEYS[1] = rq:queue:<name>:intermediate   (the queue server)
-- ARGV[1] = the job hash keys' prefix (rq:job:)
-- Returns {entry, {field, value, ...}} ({} for a hash that does not exist); {} when the list is empty.
local id = redis.call('LINDEX', KEYS[1], -1)
if not id then return {} end
return {id, redis.call('HGETALL', ARGV[1] .. id)}
