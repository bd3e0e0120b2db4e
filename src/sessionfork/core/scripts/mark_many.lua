-- mark.lua for many sessions of one kind and value on one server (a select's abandoned
-- candidates: one call, where each took one), and the ended index written once for them all.
-- KEYS[1] = sf:ended, then each session's record sf:s:{<id>}
-- ARGV    = "merged" or "abandoned", the value (as mark.lua's), now (epoch ms), the holder (as
--           mark.lua's), then each session's id, in KEYS' order
-- Idempotent as mark.lua. Returns, for each session in order, 1, or 0 when its record is gone.
--#include lib/hold.lua
--#include lib/mark.lua
local out, ended = {}, {}
for i = 2, #KEYS do
  if mark_record(KEYS[i], ARGV[1], ARGV[2], ARGV[4]) then
    out[#out + 1] = 1
    ended[#ended + 1] = ARGV[3]
    ended[#ended + 1] = ARGV[3 + i]
  else
    out[#out + 1] = 0
  end
end
if #ended > 0 then redis.call('ZADD', KEYS[1], 'NX', unpack(ended)) end
return out
