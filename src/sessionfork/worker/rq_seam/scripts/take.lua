-- Take up to ARGV[1] entries off a queue's head into RQ's intermediate queue, atomically: what
-- RQ's dequeue does one LMOVE at a time. An entry taken is never in neither list: a worker killed
-- after this finds it recovered from the intermediate queue (SeamWorker._requeue_stranded) or,
-- once started, from RQ's started registry. The entries' job hashes are read after, natively
-- (passed through Lua, a batch's hashes cost the server more than the reads themselves).
-- KEYS[1] = rq:queue:<name>, KEYS[2] = rq:queue:<name>:intermediate   (the queue server)
-- ARGV[1] = how many entries at most (>= 1)
-- Returns the entries taken, in queue order ({} when the queue was empty).
local ids = redis.call('LPOP', KEYS[1], ARGV[1])
if not ids then return {} end
redis.call('RPUSH', KEYS[2], unpack(ids))
return ids
