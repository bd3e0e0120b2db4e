-- Where an event of a session's own log stands: between turns or inside one (read-only).
-- KEYS[1] = sf:s:{<id>}, KEYS[2] = sf:s:{<id>}:turns, KEYS[3] = sf:s:{<id>}:log
--           (one slot; the session may be disposed)
-- ARGV[1] = index of the event in the session's own log (its seq minus seedlen): a descendant
--           reading this log through a summary child numbers it differently, so it names the
--           event by position, and maps the seqs returned with the seedlen returned
-- Returns {"OK", seq of the newest turn/end at or before it (-1: none), type of the event, seedlen} /
-- {"INSIDE", seq of the turn/start of the turn it is inside, seedlen} / {"NOINDEX"} (a record
-- written before turn indexes). Seqs are this session's own.
--#include lib/turns.lua
local r = redis.call('HMGET', KEYS[1], 'lastend', 'seedend', 'seedlen', 'len')
if not r[1] then return {'NOINDEX'} end
r[2] = r[2] or r[1]  -- absent until an append moves lastend (create.lua)
r[3] = r[3] or r[4]  -- absent until the first append: the seed is the whole log
local b = tonumber(ARGV[1]) + tonumber(r[3])
local found = newest(KEYS[2], b)
if found and found % 2 == 0 then return {'INSIDE', math.floor(found / 2), r[3]} end
if found == 2 * b + 1 then return {'OK', b, 'turn/end', r[3]} end
local raw = redis.call('LINDEX', KEYS[3], tonumber(ARGV[1]))
local kind = string.match(raw, '^{"type":"([^"\\]*)"') or cjson.decode(raw)['type']
if not found then return {'OK', r[2], kind, r[3]} end
return {'OK', math.floor(found / 2), kind, r[3]}
