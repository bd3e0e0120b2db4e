-- RQ's success bookkeeping of a batch of jobs started by started.lua (rq_seam.ledger): for each
-- job, what RQ's Job._handle_success (the two job hash fields that change, its result), the job
-- hash's EXPIRE and the execution's cleanup write; the registries the jobs share written once.
-- RQ's key names are built from the prefixes given (the queue server is one server, never a
-- cluster); tests/worker/test_batches.py compares all of it with what RQ's own methods write.
-- ARGV = worker name, result TTL (s, positive), now (RQ's current_timestamp), now (RQ's
--        utcformat), now (a timestamp, as RQ writes it), "3" or "2" (RQ's major version), the job
--        status "finished", the result type (successful), the prefixes of an execution's hash, of
--        a job's executions index, of a job's hash and of its results stream, the finished and the
--        started registry, RQ 3's worker executions set, the worker's hash ("": the worker has
--        started a later batch, it keeps its current job), then for each job: its
--        id, its execution's id and start (a timestamp), its return value as RQ encodes it ("":
--        none)
-- Returns how many jobs it finished.
local worker, ttl, stamp, text, at = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local rq3 = ARGV[6] == '3'
local finished, composite = {}, {}
for i = 17, #ARGV, 4 do
  local job, id, began, value = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local hash = ARGV[11] .. job
  redis.call('HSET', hash, 'status', ARGV[7], 'ended_at', text)
  local results = ARGV[12] .. job
  if value ~= '' then
    redis.call('XADD', results, 'MAXLEN', '~', '10', '*', 'type', ARGV[8], 'worker_name', worker,
      'return_value', value, 'execution_id', id, 'execution_started_at', began, 'execution_ended_at', at)
  else
    redis.call('XADD', results, 'MAXLEN', '~', '10', '*', 'type', ARGV[8], 'worker_name', worker,
      'execution_id', id, 'execution_started_at', began, 'execution_ended_at', at)
  end
  redis.call('EXPIRE', results, ttl)
  redis.call('EXPIRE', hash, ttl)
  redis.call('DEL', ARGV[9] .. job .. ':' .. id)
  redis.call('ZREM', ARGV[10] .. job, id)
  finished[#finished + 1] = stamp + ttl
  finished[#finished + 1] = job
  composite[#composite + 1] = job .. ':' .. id
end
if #composite == 0 then return 0 end
redis.call('ZADD', ARGV[13], unpack(finished))
redis.call('ZREM', ARGV[14], unpack(composite))
if rq3 then
  redis.call('SREM', ARGV[15], unpack(composite))
elseif ARGV[16] ~= '' then
  -- RQ 2's worker names its current job; "" while a later batch of the worker's has started
  redis.call('HDEL', ARGV[16], 'current_job')
end
return #composite
