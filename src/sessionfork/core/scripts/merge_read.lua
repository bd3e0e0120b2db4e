-- The child's step of a merge: which of its own events a merge brings back, and the hold that makes
-- one request at a time change its state (lib/hold.lua): a merge keeps the range it resolved (its
-- plan: a retry of the request merges the same range); a select holds its winner and, on one server,
-- its other candidates in the same step (on a cluster, hold.lua holds each on its own slot).
-- KEYS[1] = sf:s:{<child>}, KEYS[2] = sf:s:{<child>}:turns, KEYS[3] = sf:s:{<child>}:log   (one slot),
--           then (a select on one server) each other candidate's record sf:s:{<id>}
-- ARGV    = ifChildLength ("" = any), fromSeq ("" = the child's seedLength), toSeq ("" = its newest
--           turn/end), most events a merge may bring back, events ("1": return the range's stored
--           JSON; "0": mode summary, none), most bytes of stored JSON it may bring back, the holder
--           (the request id, or the call's token), now (epoch ms), the request window (ms), select
--           ("1": a select's winner, "0": a merge), the child's id, then each other candidate's id
--           in KEYS' order
-- Returns {"NOT_FOUND", id} (never created, or deleted) / {"ABANDONED", id, request id} /
--   {"MERGED", id, mergedinto} (a select's candidate merged before) / {"BUSY", id, holder} (another
--   request holds it) / {"PRECONDITION", len} / {"RANGE", why, len, seedlen} (why: EMPTY no
--   completed turn after the seed, SEED fromSeq inside the seed, PAST toSeq past the end, ORDER
--   fromSeq after toSeq, MANY more events than the limit, BYTES more bytes than the limit) /
--   {"INSIDE", toSeq, seq of the turn/start} / {"NOINDEX", len, seedlen}
--   (a record written before turn indexes: the caller checks the range by reading it) /
--   {"OK", fromSeq, toSeq, len, seedlen, stored JSON of each event when asked}
-- A refusal writes nothing. A plan kept by an earlier run of the request within the window answers
-- with its range, before the guard and the range rules (a retry merges what the first run resolved,
-- whatever the child holds now).
--#include lib/turns.lua
--#include lib/hold.lua
local holder, now, window, select = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10] == '1'
local field = 'plan:' .. holder
local r = redis.call('HMGET', KEYS[1], 'header', 'len', 'seedlen', 'lastend', 'abandoned', field)
if not r[1] then return {'NOT_FOUND', ARGV[11]} end
local len = tonumber(r[2])
local seedlen = tonumber(r[3] or r[2])  -- absent until the first append: the seed is the whole log
local plan = r[6] and live(r[6], now, window) and r[6]
if not plan and r[5] then return {'ABANDONED', ARGV[11], r[5]} end
if select then
  local why = refusal(KEYS[1], ARGV[11], holder, now, window)
  if why then return why end
  for i = 4, #KEYS do
    why = refusal(KEYS[i], ARGV[8 + i], holder, now, window)
    if why then return why end
  end
else
  local by = held_by(KEYS[1], holder, now, window, false)
  if by then return {'BUSY', ARGV[11], by} end
end
local from, to
if plan then
  local f, t = string.match(plan, '^(%d+) (%d+)')
  from, to = tonumber(f), tonumber(t)
else
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
if not plan then redis.call('HSET', KEYS[1], field, from .. ' ' .. to .. ' ' .. now) end
if select then
  local value = holder .. ' ' .. now
  for i = 1, #KEYS do
    if i == 1 or i > 3 then redis.call('HSET', KEYS[i], 'hold', value) end
  end
end
return out
