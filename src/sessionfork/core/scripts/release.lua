-- A child of this session reads less of its log, or nothing (gone for good), or (ARGV[1] "") this
-- session was just deleted: update the children index; then, when this session is deleted, free
-- what no descendant reads any more. Gone for good (no descendant left): its own log, indexes and
-- seed fields. Still pinned: the first seq any descendant reads is the least need of its children
-- (sf:s:{<id>}:needs: where each child starts reading; a child without an entry - plain, boundary,
-- or indexed before needs existed - reads from 0). Own-log positions before it are replaced by
-- empty placeholders (positions never move: descendants' slices index this list; counted in
-- "freed", never redone), and so are its turn markers but the last (see below).
-- KEYS[1] = sf:s:{<id>}, KEYS[2] = sf:s:{<id>}:log, KEYS[3] = sf:s:{<id>}:children,
-- KEYS[4] = sf:s:{<id>}:turns, KEYS[5] = sf:s:{<id>}:needs   (one slot)
-- ARGV[1] = the child ("" = none), ARGV[2] = "" when it is gone or reads nothing of this log any
--           more (unpin it), else the first seq of this log it reads now (raise its entry to that:
--           a child's descendants only ever read less)
-- Returns false, or {parent id, need} for the caller's next step on the parent ("" = no parent):
-- need "" when this deleted session reads nothing of its parent's log any more (gone for good, or
-- its descendants read only its own events: least need >= seedlen), else the first seq of the
-- parent it reads now (its least need > 0 mapped to the parent's seqs: a summary child's seq i is
-- its parent's keepFrom - 1 + i).
if ARGV[1] ~= '' then
  if ARGV[2] == '' then
    redis.call('SREM', KEYS[3], ARGV[1])
    redis.call('ZREM', KEYS[5], ARGV[1])
  elseif redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then  -- never an entry without its pin
    local had = tonumber(redis.call('ZSCORE', KEYS[5], ARGV[1]) or '0')
    if tonumber(ARGV[2]) > had then redis.call('ZADD', KEYS[5], ARGV[2], ARGV[1]) end
  end
end
if redis.call('HEXISTS', KEYS[1], 'deleted') == 0 then return false end
local left = redis.call('SCARD', KEYS[3])
local parent = redis.call('HGET', KEYS[1], 'parent') or ''
if left == 0 then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  redis.call('HDEL', KEYS[1], 'parent', 'seed', 'seedlen', 'lastend', 'seedend', 'summary', 'freed', 'keptfrom')
  return {parent, ''}
end
local need = 0
if redis.call('ZCARD', KEYS[5]) == left then
  need = tonumber(redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2])
end
local seedlen = tonumber(redis.call('HGET', KEYS[1], 'seedlen'))
if not seedlen then return false end  -- gone for good already (an index entry re-added after)
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
if need >= seedlen then return {parent, ''} end
if need == 0 or parent == '' then return false end
local kept = redis.call('HGET', KEYS[1], 'keptfrom')  -- absent: seqs are the parent's own
return {parent, tostring(kept and tonumber(kept) - 1 + need or need)}
