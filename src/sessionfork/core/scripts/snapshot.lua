-- The source step of a fork: live? instance? boundary? length - in one atomic read.
-- KEYS[1] = sf:s:{<id>}   (one slot)
-- ARGV[1] = instance token ("" = any live instance)
-- Returns {"OK", len, header, seed, seedlen} or {"NOT_FOUND"} / {"NOT_LIVE"} / {"OPEN_TURN", last}.
local r = redis.call('HMGET', KEYS[1], 'instance', 'len', 'last', 'header', 'seed', 'seedlen')
if not r[1] then return {'NOT_FOUND'} end
if ARGV[1] ~= '' and r[1] ~= ARGV[1] then return {'NOT_LIVE'} end
if r[2] ~= '0' and r[3] ~= 'turn/end' then return {'OPEN_TURN', r[3]} end
return {'OK', r[2], r[4], r[5], r[6]}
