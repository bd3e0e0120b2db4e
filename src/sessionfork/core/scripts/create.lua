-- Create a session record if its id is free: a new session (len 0) or a forked child, with the
-- child's edits (events appended right after its seed) in the same atomic step.
-- KEYS[1] = sf:s:{<id>}      (the new session's record)
-- KEYS[2] = sf:s:{<id>}:log, KEYS[3] = sf:s:{<id>}:turns   (the new session's own events and turn
--           index: written only for edits)
-- KEYS[4] = sf:lifecycle, KEYS[5] = the parent's sf:s:{<parent>}:children
--           (both optional: given only when they share the server, i.e. not on a cluster, where
--           the registry pins the child under its parent first (pin.lua) and emits the event after)
-- KEYS[6] = the parent's record sf:s:{<parent>}   (optional, with KEYS[5]: a forked child on one server)
-- KEYS[7] = the parent's sf:s:{<parent>}:needs     (optional, with KEYS[6]: a summary child on one server)
-- ARGV    = header (the record's "header" field: lib/header.lua), instance token, len (seed + edits), seedlen, seed JSON, last type, request
--           id ("" = none), lifecycle stream MAXLEN, session id, seed end: seq of the newest
--           turn/end of the seed (-1: none; "": unknown, the record gets no turn index, as one
--           written before it existed), the parent's header JSON as the source step read it (used
--           with KEYS[6]), last end: seq of the newest turn/end of seed + edits ("" = the seed
--           end), the edits' turn-index entries ("2*seq + (1 for turn/end)", space-separated),
--           the summary child's session/summary event (stored JSON, its seq 0; "" = not one: the
--           seed's slice ["@<id>", 0, 1] reads it from field "summary"), need: the first seq of
--           the parent the child reads (a summary child's keepFrom, recorded in KEYS[7] with the
--           pin; "" = 0, all), cwd ("" = none, else "=" followed by the cwd: the compact layout's
--           "cwd" field), parent id ("" = none: the compact layout's "parent" field), the parent's
--           header as its compact record holds it (used with KEYS[6]: its "header" field, its "cwd"
--           field as the cwd argument writes it, its "parent" field or ""), then the edits' stored
--           JSON (none for a plain child)
-- Returns 1 for a record created now (the caller has the header it sent); the header (wire JSON) of
-- the record under KEYS[1] when it was ours already (created earlier by the same request id: a
-- replay, or by this very call: a client's retry after a lost reply, recognised by the fresh
-- instance token); false when another owner has the id, or -1 when
-- the parent is not the session the source step read, or is shorter than the seed (the server
-- restarted empty, or lost writes in a failover): the seed could not be read, so no child.
-- A deleted parent (a tombstone: no header) is not the session read either: the fork fails
-- SESSION_NOT_FOUND, and a deleted log is never a new child's seed. A replay never appends the
-- edits again: they exist only together with the record.
--#include lib/header.lua
if redis.call('EXISTS', KEYS[1]) == 1 then
  local mine = redis.call('HMGET', KEYS[1], 'req', 'instance', 'header', 'cwd', 'parent')
  if (ARGV[7] ~= '' and mine[1] == ARGV[7]) or mine[2] == ARGV[2] then
    return header_json(ARGV[9], mine[3], mine[4], mine[5])
  end
  return false
end
if KEYS[6] then
  local parent = redis.call('HMGET', KEYS[6], 'header', 'len', 'cwd', 'parent')
  -- Compared as stored first (the old layout's JSON, or the compact fields this release writes for
  -- the header read: one string compare each, where decoding both took most of a child's script
  -- time); a record written otherwise is compared decoded.
  local same = parent[1] and (parent[1] == ARGV[11] or (parent[1] == ARGV[18]
    and (parent[3] and '=' .. parent[3] or '') == ARGV[19] and (parent[4] or '') == ARGV[20]))
  if not parent[1] or not (same or same_header(header_of(parent[1], parent[3], parent[4]), cjson.decode(ARGV[11])))
      or tonumber(parent[2]) < tonumber(ARGV[4]) then
    return -1
  end
end
-- "seedlen" and "seedend" are stored only once they differ from "len" and "lastend" (append.lua
-- writes them before it moves those): two fields fewer in every record never appended to (most
-- children of a fan-out); readers take len / lastend when they are absent.
-- One HSET of every field the record starts with (one command, where one per optional field took up
-- to five).
local fields = {'header', ARGV[1], 'instance', ARGV[2], 'len', ARGV[3], 'seed', ARGV[5], 'last', ARGV[6]}
local cwd, parent_id = nil, nil
if ARGV[16] ~= '' then
  cwd = string.sub(ARGV[16], 2)
  fields[#fields + 1] = 'cwd'; fields[#fields + 1] = cwd
end
if ARGV[17] ~= '' then
  parent_id = ARGV[17]
  fields[#fields + 1] = 'parent'; fields[#fields + 1] = parent_id
end
if ARGV[4] ~= ARGV[3] then
  fields[#fields + 1] = 'seedlen'; fields[#fields + 1] = ARGV[4]
end
if ARGV[7] ~= '' then
  fields[#fields + 1] = 'req'; fields[#fields + 1] = ARGV[7]
end
if ARGV[10] ~= '' then
  -- A seed ends between turns (the boundary rule), so the turn index of the new record starts
  -- empty: boundaries inside the seed are checked against the ancestors' own indexes.
  fields[#fields + 1] = 'lastend'; fields[#fields + 1] = ARGV[10]
end
if ARGV[14] ~= '' then
  fields[#fields + 1] = 'summary'; fields[#fields + 1] = ARGV[14]
end
redis.call('HSET', KEYS[1], unpack(fields))
local first = 21
if #ARGV >= first then
  redis.call('HSET', KEYS[1], 'edits', #ARGV - first + 1)  -- how many events the fork appended (lineage)
  for i = first, #ARGV, 4000 do
    redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 3999, #ARGV)))
  end
  if ARGV[10] ~= '' then
    local marks = {}
    for tok in string.gmatch(ARGV[13], '%S+') do marks[#marks + 1] = tok end
    if #marks > 0 then redis.call('RPUSH', KEYS[3], unpack(marks)) end
    if ARGV[12] ~= ARGV[10] then
      redis.call('HSET', KEYS[1], 'seedend', ARGV[10], 'lastend', ARGV[12])
    end
  end
end
if KEYS[4] then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 'type', 'session/created', 'id', ARGV[9],
    'len', ARGV[3])
end
if KEYS[5] then
  redis.call('SADD', KEYS[5], ARGV[9])
  if KEYS[7] and ARGV[15] ~= '' then
    redis.call('ZADD', KEYS[7], ARGV[15], ARGV[9])
  end
end
return 1
