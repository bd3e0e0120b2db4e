-- The child's step of a merge: which of its own events a merge brings back. It reads, and keeps
-- the range a request resolved (its plan): a retry of the request merges the same range.
-- KEYS[1] = sf:s:{<child>}, KEYS[2] = sf:s:{<child>}:turns, KEYS[3] = sf:s:{<child>}:log   (one slot)
-- ARGV    = ifChildLength ("" = any), fromSeq ("" = the child's seedLength), toSeq ("" = its newest
--           turn/end), most events a merge may bring back, events ("1": return the range's stored
--           JSON; "0": mode summary, none), most bytes of stored JSON it may bring back, the plan's
--           field ("plan:<request id>"; "" = no request id, nothing kept)
-- Returns {"NOT_FOUND"} (never created, or deleted) / {"ABANDONED", request id} /
--   {"PRECONDITION", len} / {"RANGE", why, len, seedlen} (why: EMPTY no completed turn after the
--   seed, SEED fromSeq inside the seed, PAST toSeq past the end, ORDER fromSeq after toSeq, MANY more
--   events than the limit, BYTES more bytes than the limit) / {"INSIDE", toSeq, seq of the turn/start} /
--   {"NOINDEX", len, seedlen}
-- A plan kept by an earlier run of the request answers OK with its range, before the guard and the
-- range rules (a retry merges what the first run resolved, whatever the child holds now).
--   (a record written before turn indexes: the caller checks the range by reading it) /
--   {"OK", fromSeq, toSeq, len, seedlen, stored JSON of each event when asked}
--#include lib/turns.lua
local r = redis.call('HMGET', KEYS[1], 'header', 'len', 'seedlen', 'lastend', 'abandoned')
if not r[1] then return {'NOT_FOUND'} end
local len = tonumber(r[2])
local seedlen = tonumber(r[3] or r[2])  -- absent until the first append: the seed is the whole log
local plan = ARGV[7] ~= '' and redis.call('HGET', KEYS[1], ARGV[7])
local from, to
if plan then
  local f, t = string.match(plan, '^(%d+) (%d+)$')
  from, to = tonumber(f), tonumber(t)
else
  if r[5] then return {'ABANDONED', r[5]} end
  if ARGV[1] ~= '' and r[2] ~= ARGV[1] then return {'PRECONDITION', len} end
  if not r[4] then return {'NOINDEX', len, seedlen} end
  from = ARGV[2] ~= '' and tonumber(ARGV[2]) or seedlen
  if ARGV[3] == '' then
    to = tonumber(r[4])
    if to < seedlen then return {'RANGE', 'EMPTY', len, seedlen} end
  else
    to = tonumber(ARGV[3])
  end
  if from < seedlen then return {'RANGE', 'SEED', len, seedlen} end
  if to >= len then return {'RANGE', 'PAST', len, seedlen} end
  if from > to then return {'RANGE', 'ORDER', len, seedlen} end
  if to - from + 1 > tonumber(ARGV[4]) then return {'RANGE', 'MANY', len, seedlen} end
  -- toSeq must not be inside a turn: the newest turn marker at or before it (in the index of the
  -- child's own events) is a turn/end, or there is none.
  local found = newest(KEYS[2], to)
  if found and found % 2 == 0 then return {'INSIDE', to, math.floor(found / 2)} end
end
local out = {'OK', from, to, len, seedlen}
if ARGV[5] == '1' then
  local events = redis.call('LRANGE', KEYS[3], from - seedlen, to - seedlen)
  local size, most = 0, tonumber(ARGV[6])
  for i = 1, #events do
    size = size + #events[i]
    if size > most then return {'RANGE', 'BYTES', len, seedlen} end
    out[#out + 1] = events[i]
  end
end
if ARGV[7] ~= '' and not plan then redis.call('HSET', KEYS[1], ARGV[7], from .. ' ' .. to) end
return out
