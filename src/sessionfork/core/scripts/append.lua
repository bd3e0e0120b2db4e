-- Append events to a live session; the position gives each its seq, so appends never gap or clash.
-- KEYS[1] = sf:s:{<id>}, KEYS[2] = sf:s:{<id>}:log, KEYS[3] = sf:s:{<id>}:turns   (one slot)
-- KEYS[4] = sf:lifecycle   (optional: given only when it shares the server, i.e. not on a cluster)
-- KEYS[5] = the record of the tree's root sf:s:{<root>} (optional, with KEYS[4]: on one server, when
--           the batch carries usage and the session has a root; KEYS[1] for a root itself)
-- ARGV    = instance token ("" = any live instance), type of the last new event,
--           expected length ("" = any), flush ("1" when the batch holds a turn/end),
--           lifecycle stream MAXLEN, session id, batch id (fresh per call),
--           turn markers of the batch ("2*position + (1 for turn/end)", space-separated; "" = none),
--           usage of the batch ("<inputTokens> <outputTokens> <cacheReadTokens> <cacheWriteTokens>
--           <costMicros>", non-negative integers; "" = none): added to the record's own usage counters
--           (uin, uout, ucr, ucw, ucost) and, with KEYS[5], to its root's tree totals (tin, tout,
--           tcr, tcw, tcost), the root the caller names ("" = none, "-" = do not sum: a cluster),
--           event JSON...
-- Returns the seq of the first new event; -1 not live, -2 stale token, -3 length moved on;
-- {-4, root} when the batch carries usage and the session's root ("" = none) is not the one named
-- (nothing written: the caller names it and calls again).
-- The same batch id again (a client's retry after a lost reply) appends nothing and returns the
-- first seq it got: an append is never doubled.
-- The turn index (KEYS[3], entries 2*seq + (1 for turn/end), and the field lastend) is kept only
-- for records that have one (a "lastend" field): a record written before it existed never gets a
-- partial index.
local rec = redis.call('HMGET', KEYS[1], 'instance', 'len', 'batch', 'batchseq', 'lastend', 'seedlen', 'seedend')
if not rec[1] then return -1 end
if ARGV[1] ~= '' and rec[1] ~= ARGV[1] then return -2 end
if rec[3] == ARGV[7] then return tonumber(rec[4]) end
if ARGV[3] ~= '' and rec[2] ~= ARGV[3] then return -3 end
if ARGV[9] ~= '' and ARGV[10] ~= '-' then
  local tr = redis.call('HMGET', KEYS[1], 'root', 'tree')
  local root = tr[1] or (tr[2] and ARGV[6]) or ''
  if root ~= ARGV[10] then return {-4, root} end
end
local first = 11
local n = #ARGV - first + 1
-- RPUSH in chunks: unpack() of a huge argument list overflows the Lua C stack.
for i = first, #ARGV, 4000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 3999, #ARGV)))
end
local base = tonumber(rec[2])
local len = base + n
if not rec[6] then
  -- First append to a record created without "seedlen" (create.lua): its seed is all it held.
  redis.call('HSET', KEYS[1], 'seedlen', rec[2])
end
redis.call('HSET', KEYS[1], 'len', len, 'last', ARGV[2], 'batch', ARGV[7], 'batchseq', rec[2])
if ARGV[9] ~= '' then
  local own, tree = {'uin', 'uout', 'ucr', 'ucw', 'ucost'}, {'tin', 'tout', 'tcr', 'tcw', 'tcost'}
  local i = 1
  for tok in string.gmatch(ARGV[9], '%S+') do
    if tok ~= '0' then
      redis.call('HINCRBY', KEYS[1], own[i], tok)
      if KEYS[5] and ARGV[10] ~= '' then redis.call('HINCRBY', KEYS[5], tree[i], tok) end
    end
    i = i + 1
  end
end
if rec[5] and ARGV[8] ~= '' then
  local marks = {}
  local lastend = nil
  for tok in string.gmatch(ARGV[8], '%S+') do
    local v = tonumber(tok)
    local seq = base + math.floor(v / 2)
    marks[#marks + 1] = 2 * seq + v % 2
    if v % 2 == 1 then lastend = seq end
  end
  for i = 1, #marks, 4000 do
    redis.call('RPUSH', KEYS[3], unpack(marks, i, math.min(i + 3999, #marks)))
  end
  if lastend then
    -- "seedend" was "lastend" until now (create.lua stores only the latter): keep it first.
    if not rec[7] then redis.call('HSET', KEYS[1], 'seedend', rec[5]) end
    redis.call('HSET', KEYS[1], 'lastend', lastend)
  end
end
if KEYS[4] and ARGV[4] == '1' then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'type', 'session/flush', 'id', ARGV[6], 'len', len)
end
return base
