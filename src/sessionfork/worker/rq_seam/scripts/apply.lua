-- Run commands recorded from RQ's own bookkeeping methods (riders.Recorded), in order, in one call:
-- the commands a pipeline would have sent one by one, each run as that pipeline runs it (an error
-- reply is that command's reply; the others still run).
-- KEYS    = none: RQ's key names are RQ's (the queue server is one server, never a cluster)
-- ARGV    = for each command: its word count, then its words
-- Returns each command's reply, in order.
local out, i = {}, 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  out[#out + 1] = redis.pcall(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return out
