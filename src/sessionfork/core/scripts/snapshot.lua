-- The source step of a fork: live? instance? boundary? length - in one atomic read.
-- KEYS[1] = sf:s:{<id>}, KEYS[2] = sf:s:{<id>}:turns, KEYS[3] = sf:s:{<id>}:log   (one slot)
-- ARGV[1] = instance token ("" = any live instance), ARGV[2] = boundary ("" = none: the whole log),
-- ARGV[3] = the length the log must have (ifLength; "" or absent = any),
-- ARGV[4] = a summary's keepFrom - 1 ("" or absent = none): checked here too when it falls in the
--           source's own events and the snapshot: an OK reply then ends with "1" (between turns),
--           or the reply is {"KEEP_INSIDE", seq of the turn/start}; otherwise the caller checks it
-- ARGV[5] = the session id (for the header: the compact layout does not store it, lib/header.lua)
-- Returns {"NOT_FOUND"} / {"NOT_LIVE"} / {"PRECONDITION", len} (the guard, checked next) /
--   {"OPEN_TURN", last} (no boundary) /
--   {"RANGE", len} (boundary outside [0, len)) / {"INSIDE", seq of the turn/start} /
--   {"OK", seed length, header (wire JSON), seed, seedlen, seed end, last type} where seed end is the seq of the
--   newest turn/end of the child's seed (-1 none, "" unknown: the source has no turn index) and
--   last type the type of its last event /
--   {"SEED", seed length, header, seed, seedlen, "", ""}: the boundary falls in the source's seed
--   (or the source has no turn index): the caller checks it against the ancestor that holds it,
--   whose events up to there never change.
--#include lib/header.lua
--#include lib/turns.lua
local function step()
  local r = redis.call('HMGET', KEYS[1], 'instance', 'len', 'last', 'header', 'seed', 'seedlen', 'lastend',
    'seedend', 'cwd', 'parent')
  if not r[1] then return {'NOT_FOUND'} end
  r[4] = header_json(ARGV[5], r[4], r[9], r[10])
  r[6] = r[6] or r[2]  -- absent until the first append: the seed is the whole log (create.lua)
  r[8] = r[8] or r[7]  -- absent until an append moves lastend
  if ARGV[1] ~= '' and r[1] ~= ARGV[1] then return {'NOT_LIVE'} end
  if ARGV[3] and ARGV[3] ~= '' and r[2] ~= ARGV[3] then return {'PRECONDITION', r[2]} end
  if ARGV[2] == '' then
    if r[2] ~= '0' and r[3] ~= 'turn/end' then return {'OPEN_TURN', r[3]} end
    return {'OK', r[2], r[4], r[5], r[6], r[7] or '', r[3]}
  end
  local b = tonumber(ARGV[2])
  if b < 0 or b >= tonumber(r[2]) then return {'RANGE', r[2]} end
  if not r[7] or b < tonumber(r[6]) then return {'SEED', b + 1, r[4], r[5], r[6], '', ''} end
  local found = newest(KEYS[2], b)
  if found and found % 2 == 0 then return {'INSIDE', math.floor(found / 2)} end
  if found == 2 * b + 1 then return {'OK', b + 1, r[4], r[5], r[6], b, 'turn/end'} end
  -- Otherwise the type of event b, for the child's "last": stored JSON starts with its "type"
  -- (wire.encode_stored_event); anything unusual is decoded whole.
  local raw = redis.call('LINDEX', KEYS[3], b - tonumber(r[6]))
  local kind = string.match(raw, '^{"type":"([^"\\]*)"') or cjson.decode(raw)['type']
  if not found then return {'OK', b + 1, r[4], r[5], r[6], r[8], kind} end
  return {'OK', b + 1, r[4], r[5], r[6], math.floor(found / 2), kind}
end
local out = step()
local k = ARGV[4] and ARGV[4] ~= '' and tonumber(ARGV[4])
if out[1] == 'OK' and k and out[8] == nil then
  local seedlen = tonumber(out[5])
  if k >= seedlen and k < tonumber(out[2]) and out[6] ~= '' then  -- '': no turn index
    local found = newest(KEYS[2], k)
    if found and found % 2 == 0 then return {'KEEP_INSIDE', math.floor(found / 2)} end
    out[8] = '1'
  end
end
return out
