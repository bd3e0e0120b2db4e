-- A request's reply, read from its record however the worker stored it (the any-language recipe's
-- step 3; FCALL sf_outcome 1 sf:req:<id>, or EVAL this text with the same key). Read-only.
-- KEYS[1] = sf:req:<request id>   (queue server; the request id is the key's tail)
-- Returns the reply JSON, the same bytes the Python clients' reply encodes to: the stored "outcome"
-- (a failure, a fan-out, or any reply of a worker run with SESSIONFORK_COMPACT_RECORDS=0), or a
-- one-child reply rebuilt from its compact fields (core/records.py: "child", "header" = [version,
-- createdAt(, seedLength(, keptFrom))], "cwd"?, "parent"?); nil when no outcome is stored yet.
-- Self-contained (no include), so that any client can EVAL the shipped file as it is; it rebuilds
-- the header as core/scripts/lib/header.lua does (tests compare both with the Python reply).
if #KEYS ~= 1 then return redis.error_reply('ERR outcome: 1 key expected, sf:req:<request id>') end
local request_id = string.match(KEYS[1], '^.-:req:(.+)$')
if not request_id then return redis.error_reply('ERR outcome: KEYS[1] must be sf:req:<request id>') end
local f = redis.call('HMGET', KEYS[1], 'outcome', 'child', 'header', 'cwd', 'parent')
if f[1] then return f[1] end
if not f[2] or not f[3] then return nil end
local function text(s)  -- a JSON string as msgspec writes it ("/" unescaped)
  return (string.gsub(cjson.encode(s), '\\/', '/'))
end
local function int(n) return string.format('%d', n) end
local session
if string.sub(f[3], 1, 1) == '{' then
  session = f[3]  -- an old-layout header: one JSON object, as the wire writes it
else
  local a = cjson.decode(f[3])
  local out = {'{"version":', int(a[1]), ',"id":', text(f[2]), ',"createdAt":', int(a[2])}
  if f[4] then out[#out + 1] = ',"cwd":' .. text(f[4]) end
  if f[5] then out[#out + 1] = ',"parentSession":' .. text(f[5]) end
  if a[3] ~= nil and a[3] ~= cjson.null then out[#out + 1] = ',"seedLength":' .. int(a[3]) end
  if a[4] ~= nil and a[4] ~= cjson.null then out[#out + 1] = ',"keptFrom":' .. int(a[4]) end
  out[#out + 1] = '}'
  session = table.concat(out)
end
return '{"type":"fork/result","requestId":' .. text(request_id) .. ',"ok":true,"session":' .. session .. '}'
