-- RQ's start bookkeeping of a batch of jobs (rq_seam.ledger): for each job, what RQ's
-- Execution.create and Job.prepare_for_execution write; the registries the jobs share written
-- once. RQ's key names are built from the prefixes given (the queue server is one server, never a
-- cluster); tests/worker/test_batches.py compares all of it with what RQ's own methods write.
-- ARGV = worker name, heartbeat TTL (s), now (RQ's current_timestamp), now (RQ's utcformat), now
--        (a timestamp, as RQ writes it), "3" or "2" (RQ's major version), the job status
--        "started", the prefixes of an execution's hash, of a job's executions index and of a
--        job's hash, the started registry, the intermediate queue, RQ 3's worker executions set,
--        then each job's id and its execution's id
-- Returns how many jobs it started.
local worker, ttl, stamp, text, at = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local rq3 = ARGV[6] == '3'
local scored, composite = {}, {}
for i = 14, #ARGV, 2 do
  local job, id = ARGV[i], ARGV[i + 1]
  local execution = ARGV[8] .. job .. ':' .. id
  if rq3 then
    redis.call('HSET', execution, 'id', id, 'job_id', job, 'created_at', at, 'last_heartbeat', at,
      'worker_name', worker)
  else
    redis.call('HSET', execution, 'id', id, 'created_at', at, 'last_heartbeat', at, 'worker_name', worker)
  end
  redis.call('EXPIRE', execution, ttl)
  local runs = ARGV[9] .. job
  redis.call('ZADD', runs, stamp + ttl + 60, id)
  redis.call('EXPIRE', runs, ttl + 60)
  redis.call('HSET', ARGV[10] .. job, 'last_heartbeat', text, 'status', ARGV[7], 'started_at', text,
    'worker_name', worker)
  redis.call('LREM', ARGV[12], 1, job)
  composite[#composite + 1] = job .. ':' .. id
  scored[#scored + 1] = stamp + ttl
  scored[#scored + 1] = job .. ':' .. id
end
if #composite == 0 then return 0 end
redis.call('ZADD', ARGV[11], unpack(scored))
if rq3 then
  redis.call('SADD', ARGV[13], unpack(composite))
  redis.call('EXPIRE', ARGV[13], ttl + 60)
end
return #composite
