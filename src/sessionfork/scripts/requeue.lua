-- Move a job stranded by a dead worker from RQ's intermediate queue back to its queue's front,
-- atomically: it is never in neither list (and a job that a live worker took meanwhile is left).
-- KEYS[1] = rq:queue:<name>:intermediate, KEYS[2] = rq:queue:<name>   (queue server)
-- ARGV[1] = job id
-- Returns 1 when moved, 0 when it was no longer there.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
