-- A descendant of this session is gone for good (or, ARGV[1] "", this session was just deleted):
-- take it out of the children index; then, when this session is deleted, free what no descendant
-- reads any more. Gone for good (no descendant left): its own log, index and seed fields. Still
-- pinned: the first seq any descendant reads is the least need of its children (sf:s:{<id>}:needs:
-- a summary child reads from its keepFrom; a child without an entry - plain, boundary, or indexed
-- before needs existed - from 0); own-log positions before it are replaced by empty placeholders
-- (positions never move: descendants' slices index this list) and counted in "freed" (never redone).
-- KEYS[1] = sf:s:{<id>}, KEYS[2] = sf:s:{<id>}:log, KEYS[3] = sf:s:{<id>}:children,
-- KEYS[4] = sf:s:{<id>}:turns, KEYS[5] = sf:s:{<id>}:needs   (one slot)
-- ARGV[1] = the id of the child that is gone ("" = none)
-- Returns the id of this session's parent ("" = none) when this deleted session reads nothing of its
-- parent's log any more (gone for good, or every descendant reads from its own events on: the
-- least need >= seedlen): the caller releases it from its parent next. False otherwise.
if ARGV[1] ~= '' then
  redis.call('SREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[5], ARGV[1])
end
if redis.call('HEXISTS', KEYS[1], 'deleted') == 0 then return false end
local left = redis.call('SCARD', KEYS[3])
local parent = redis.call('HGET', KEYS[1], 'parent') or ''
if left == 0 then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  redis.call('HDEL', KEYS[1], 'parent', 'seed', 'seedlen', 'lastend', 'seedend', 'summary', 'freed')
  return parent
end
local need = 0
if redis.call('ZCARD', KEYS[5]) == left then
  need = tonumber(redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2])
end
local seedlen = tonumber(redis.call('HGET', KEYS[1], 'seedlen'))
if need >= 1 then
  redis.call('HDEL', KEYS[1], 'summary')  -- a summary child's seq 0: no descendant reads it now
end
-- The turn index (sorted): a boundary check of a kept event (seq >= need) binary-searches it for
-- the newest marker at or before that event, so the markers before need go but the last of them.
local lo, hi = 0, redis.call('LLEN', KEYS[4])  -- the first marker at or past need: a binary search
while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  if math.floor(tonumber(redis.call('LINDEX', KEYS[4], mid)) / 2) < need then lo = mid + 1 else hi = mid end
end
if lo > 1 then redis.call('LTRIM', KEYS[4], lo - 1, -1) end
local target = math.min(math.max(need - seedlen, 0), redis.call('LLEN', KEYS[2]))
local freed = tonumber(redis.call('HGET', KEYS[1], 'freed') or '0')
if target > freed then
  redis.call('LTRIM', KEYS[2], target, -1)  -- O(target); no event passes through Lua
  local blanks = {}
  for i = 1, math.min(target, 1000) do blanks[i] = '' end
  for i = 1, target, 1000 do  -- chunks: unpack() of a huge table overflows the Lua C stack
    redis.call('LPUSH', KEYS[2], unpack(blanks, 1, math.min(1000, target - i + 1)))
  end
  redis.call('HSET', KEYS[1], 'freed', target)
end
if need >= seedlen then return parent end
return false
