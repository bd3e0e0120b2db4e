-- Append events to a live session; the position gives each its seq, so appends never gap or clash.
-- KEYS[1] = sf:s:{<id>}, KEYS[2] = sf:s:{<id>}:log   (one slot)
-- ARGV    = instance token ("" = any live instance), type of the last new event, event JSON...
-- Returns the seq of the first new event, -1 when the session is not live, -2 on a stale token.
local rec = redis.call('HMGET', KEYS[1], 'instance', 'len')
if not rec[1] then return -1 end
if ARGV[1] ~= '' and rec[1] ~= ARGV[1] then return -2 end
local n = #ARGV - 2
-- RPUSH in chunks: unpack() of a huge argument list overflows the Lua C stack.
for i = 3, #ARGV, 4000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 3999, #ARGV)))
end
redis.call('HSET', KEYS[1], 'len', tonumber(rec[2]) + n, 'last', ARGV[2])
return tonumber(rec[2])
