-- The parent's step of a merge or a select: its whole turn written at once, or nothing.
-- KEYS[1] = sf:s:{<parent>}, KEYS[2] = sf:s:{<parent>}:log, KEYS[3] = sf:s:{<parent>}:turns,
-- KEYS[4] = sf:s:{<parent>}:merges, KEYS[5] = sf:s:{<parent>}:mergereqs   (one slot)
-- KEYS[6] = sf:lifecycle   (optional: given only when it shares the server, i.e. not on a cluster)
-- ARGV    = instance token ("" = any live instance), ifParentLength ("" = any), request id ("" =
--           none), the merge's key in the index (["m",child,fromSeq,toSeq]), the child merged, the
--           select's other candidates (space-separated; "" for a merge), lifecycle stream MAXLEN, the
--           parent's id, the request's key in the index (["r",request id]; "" = none), fromSeq,
--           toSeq, now (epoch ms), the request window (ms), then the events' stored JSON in order:
--           turn/start, session/merge (written with its data's last member added here:
--           ,"parentLength":<length>), the merged content, turn/end
-- The merges index (KEYS[4], a hash; core/keys.py) holds per merge its key -> "<request id> <first
-- seq> <length after>" (request id "-": none); per request id, for the request window, ["r",id] ->
-- "<first seq> <length after> <fromSeq> <toSeq> <ms>" (KEYS[5] scores those ids by that time: each
-- merge drops a few that are past the window); a select also notes each candidate, ["c",id] ->
-- "m <request id> <first seq>" for its winner, "a <request id>" for the others.
-- Returns {"REPLAY", first seq, length after, fromSeq, toSeq} (this request id merged within the
-- window: nothing written, whatever the parent's state now) / {"NOT_FOUND"} / {"NOT_LIVE"} /
-- {"ALREADY", session, request id, seq or ""} (merged, or for a select abandoned, before) /
-- {"PRECONDITION", len} / {"OPEN_TURN", last type} / {"OK", first seq, length after}
local now, window = tonumber(ARGV[12]), tonumber(ARGV[13])
if ARGV[9] ~= '' then
  local got = redis.call('HGET', KEYS[4], ARGV[9])
  if got then
    local at, after, from, to, ms = string.match(got, '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
    if now - tonumber(ms) < window then return {'REPLAY', at, after, from, to} end
  end
end
local done = redis.call('HGET', KEYS[4], ARGV[4])
local by, at
if done then by, at = string.match(done, '^(%S+) (%S+)') end
local r = redis.call('HMGET', KEYS[1], 'header', 'instance', 'len', 'last', 'lastend', 'seedlen', 'seedend')
if not r[1] then return {'NOT_FOUND'} end
if not r[2] or (ARGV[1] ~= '' and r[2] ~= ARGV[1]) then return {'NOT_LIVE'} end
if done then return {'ALREADY', ARGV[5], by, at} end
local function seen_key(id) return '["c",' .. cjson.encode(id) .. ']' end
local others = {}
for id in string.gmatch(ARGV[6], '%S+') do others[#others + 1] = id end
local ids = {ARGV[5], unpack(others)}
if #others > 0 then  -- a select: no candidate merged or abandoned here before (a stale selection)
  local fields = {}
  for i, id in ipairs(ids) do fields[i] = seen_key(id) end
  local seen = redis.call('HMGET', KEYS[4], unpack(fields))
  for i = 1, #ids do
    if seen[i] then
      local _, req, seq = string.match(seen[i], '^(%S) (%S+) ?(%S*)$')
      return {'ALREADY', ids[i], req, seq}
    end
  end
end
if ARGV[2] ~= '' and r[3] ~= ARGV[2] then return {'PRECONDITION', r[3]} end
if r[3] ~= '0' and r[4] ~= 'turn/end' then return {'OPEN_TURN', r[4]} end
local base = tonumber(r[3])
local first = 14
local n = #ARGV - first + 1
-- session/merge's parentLength is known only here, where the length is read and moved at once.
local meta = ARGV[first + 1]
redis.call('RPUSH', KEYS[2], ARGV[first], string.sub(meta, 1, -3) .. ',"parentLength":' .. base .. '}}')
for i = first + 2, #ARGV, 4000 do  -- in chunks: unpack() of a huge list overflows the Lua C stack
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 3999, #ARGV)))
end
local len = base + n
if not r[6] then redis.call('HSET', KEYS[1], 'seedlen', r[3]) end  -- as append.lua: the seed was all it held
redis.call('HSET', KEYS[1], 'len', len, 'last', 'turn/end')
if r[5] then
  -- One turn in the index: the merge's own turn/start and turn/end. The merged events' turn markers
  -- lie inside it (a fork boundary there is inside the merge's turn).
  redis.call('RPUSH', KEYS[3], 2 * base, 2 * (len - 1) + 1)
  if not r[7] then redis.call('HSET', KEYS[1], 'seedend', r[5]) end
  redis.call('HSET', KEYS[1], 'lastend', len - 1)
end
local rid = ARGV[3] ~= '' and ARGV[3] or '-'
local marks = {ARGV[4], rid .. ' ' .. base .. ' ' .. len}
if #others > 0 then
  marks[#marks + 1] = seen_key(ARGV[5]); marks[#marks + 1] = 'm ' .. rid .. ' ' .. base
  for _, id in ipairs(others) do
    marks[#marks + 1] = seen_key(id); marks[#marks + 1] = 'a ' .. rid
  end
end
if ARGV[9] ~= '' then
  marks[#marks + 1] = ARGV[9]; marks[#marks + 1] = base .. ' ' .. len .. ' ' .. ARGV[10] .. ' ' .. ARGV[11] .. ' ' .. ARGV[12]
  redis.call('ZADD', KEYS[5], now, ARGV[3])
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now - window, 'LIMIT', 0, 8)) do
    redis.call('HDEL', KEYS[4], '["r",' .. cjson.encode(id) .. ']')
    redis.call('ZREM', KEYS[5], id)
  end
end
redis.call('HSET', KEYS[4], unpack(marks))
if KEYS[6] then
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[7], '*', 'type', 'session/flush', 'id', ARGV[8], 'len', len)
end
return {'OK', base, len}
