-- A select's hold on one of its other candidates, on a cluster (on one server merge_read.lua
-- holds them all with the winner, in one step): lib/hold.lua.
-- KEYS[1] = sf:s:{<id>}
-- ARGV    = the holder (the request id, or the call's token), now (epoch ms), the request window
--           (ms), the session id
-- Returns {"OK"} (held) or the refusal of lib/hold.lua's refusal(), nothing written.
--#include lib/hold.lua
local now, window = tonumber(ARGV[2]), tonumber(ARGV[3])
local why = refusal(KEYS[1], ARGV[4], ARGV[1], now, window)
if why then return why end
redis.call('HSET', KEYS[1], 'hold', ARGV[1] .. ' ' .. ARGV[2])
return {'OK'}
