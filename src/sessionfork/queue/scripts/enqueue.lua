-- Enqueue one fork request as an RQ job, once per request id: the README's any-language recipe.
-- KEYS[1] = rq:job:<request id>, KEYS[2] = rq:queue:<queue name>,
-- KEYS[3] (optional) = rq:queues, the set of queue keys RQ lists (rq info, rq-dashboard)
-- ARGV[1] = request id (the RQ job id); ARGV[2..] = field, value, ... of the job hash
-- Returns 1 when enqueued, 0 when a job with that id exists (queued, running or done).
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('RPUSH', KEYS[2], ARGV[1])
if KEYS[3] then redis.call('SADD', KEYS[3], KEYS[2]) end
return 1
