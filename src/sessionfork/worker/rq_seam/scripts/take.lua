-- Take up to ARGV[1] entries off a queue's head into RQ's intermediate queue, with each entry's job
-- hash, atomically: what RQ's dequeue does one LMOVE (and one HGETALL) at a time. An entry taken
-- is never in neither list: a worker killed after this finds it recovered from the intermediate
-- queue (SeamWorker._requeue_stranded) or, once started, from RQ's started registry.
-- KEYS[1] = rq:queue:<name>, KEYS[2] = rq:queue:<name>:intermediate   (the queue server)
-- ARGV[1] = how many entries at most (>= 1), ARGV[2] = the job hash keys' prefix (rq:job:)
-- Returns {entry, {field, value, ...}, entry, {...}, ...}: each entry with its job hash ({} when it
-- names none); {} when the queue was empty.
local ids = redis.call('LPOP', KEYS[1], ARGV[1])
if not ids then return {} end
redis.call('RPUSH', KEYS[2], unpack(ids))
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGETALL', ARGV[2] .. id)
end
return out
