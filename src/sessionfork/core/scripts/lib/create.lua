-- create.lua's steps, shared with create_many.lua (which runs them for each of many children):
-- ``k`` and ``a`` are create.lua's KEYS and ARGV (see there).
--#include lib/header.lua
-- The reply for a record that exists under k[1] (the header's wire JSON when it is ours already:
-- created by the same request id, or by this very call; false when another owner has the id), or
-- nil when the id is free.
local function existing(k, a)
  if redis.call('EXISTS', k[1]) == 0 then return nil end
  local mine = redis.call('HMGET', k[1], 'req', 'instance', 'header', 'cwd', 'parent')
  if (a[7] ~= '' and mine[1] == a[7]) or mine[2] == a[2] then
    return header_json(a[9], mine[3], mine[4], mine[5])
  end
  return false
end
-- Whether the parent under k[6] is still the session the source step read, at least as long as
-- the seed.
local function parent_ok(k, a)
  local parent = redis.call('HMGET', k[6], 'header', 'len', 'cwd', 'parent')
  -- Compared as stored first (the old layout's JSON, or the compact fields this release writes for
  -- the header read: one string compare each, where decoding both took most of a child's script
  -- time); a record written otherwise is compared decoded.
  local same = parent[1] and (parent[1] == a[11] or (parent[1] == a[18]
    and (parent[3] and '=' .. parent[3] or '') == a[19] and (parent[4] or '') == a[20]))
  if not parent[1] or not (same or same_header(header_of(parent[1], parent[3], parent[4]), cjson.decode(a[11])))
      or tonumber(parent[2]) < tonumber(a[4]) then
    return false
  end
  return true
end
-- "seedlen" and "seedend" are stored only once they differ from "len" and "lastend" (append.lua
-- writes them before it moves those): two fields fewer in every record never appended to (most
-- children of a fan-out); readers take len / lastend when they are absent.
-- One HSET of every field the record starts with, a child with edits included (one command, where
-- one per optional field took up to five).
-- The fields of that HSET (``record_fields``); the instance token is the 4th word, so that the
-- children of one seed share one list (create_many.lua sets each child's token in it).
local function record_fields(a)
  local fields = {'header', a[1], 'instance', a[2], 'len', a[3], 'seed', a[5], 'last', a[6]}
  local cwd, parent_id = nil, nil
  if a[16] ~= '' then
    cwd = string.sub(a[16], 2)
    fields[#fields + 1] = 'cwd'; fields[#fields + 1] = cwd
  end
  if a[17] ~= '' then
    parent_id = a[17]
    fields[#fields + 1] = 'parent'; fields[#fields + 1] = parent_id
  end
  if a[4] ~= a[3] then
    fields[#fields + 1] = 'seedlen'; fields[#fields + 1] = a[4]
  end
  if a[7] ~= '' then
    fields[#fields + 1] = 'req'; fields[#fields + 1] = a[7]
  end
  local edited = #a >= 21  -- a child with edits: a[21...] are their stored JSON
  if a[10] ~= '' then
    -- A seed ends between turns (the boundary rule), so the turn index of the new record starts
    -- empty: boundaries inside the seed are checked against the ancestors' own indexes. Edits that
    -- close a turn move the newest turn/end (a[12]) past the seed's end, which is then kept too.
    local moved = edited and a[12] ~= a[10]
    fields[#fields + 1] = 'lastend'; fields[#fields + 1] = moved and a[12] or a[10]
    if moved then
      fields[#fields + 1] = 'seedend'; fields[#fields + 1] = a[10]
    end
  end
  if a[14] ~= '' then
    fields[#fields + 1] = 'summary'; fields[#fields + 1] = a[14]
  end
  if edited then  -- how many events the fork appended (lineage)
    fields[#fields + 1] = 'edits'; fields[#fields + 1] = #a - 20
  end
  return fields
end
-- ``fields``: a plain child's record fields when built already (``record_fields(a)``, a[2] the
-- 4th word).
local function create_record(k, a, fields)
  fields = fields or record_fields(a)
  -- The tree's root, whose record sums the usage of every append in its tree (append.lua): a new
  -- session is a root ("tree"); a child on one server names its parent's root, or its parent when
  -- that is a root (a child of a session without either, or on a cluster, names none). In the one
  -- HSET; found once for the children of one call (``fields`` is shared by a fan-out's).
  if not fields.rooted then
    fields.rooted = true
    local root = nil
    if k[6] then
      local up = redis.call('HMGET', k[6], 'root', 'tree')
      root = up[1] or (up[2] and a[17] ~= '' and a[17]) or nil
    end
    if root then
      fields[#fields + 1] = 'root'; fields[#fields + 1] = root
    elseif not k[6] and a[17] == '' then
      fields[#fields + 1] = 'tree'; fields[#fields + 1] = '1'
    end
  end
  redis.call('HSET', k[1], unpack(fields))
  local first = 21
  if #a >= first then
    for i = first, #a, 4000 do
      redis.call('RPUSH', k[2], unpack(a, i, math.min(i + 3999, #a)))
    end
    if a[10] ~= '' then
      local marks = {}
      for tok in string.gmatch(a[13], '%S+') do marks[#marks + 1] = tok end
      if #marks > 0 then redis.call('RPUSH', k[3], unpack(marks)) end
    end
  end
  if k[4] then
    redis.call('XADD', k[4], 'MAXLEN', '~', a[8], '*', 'type', 'session/created', 'id', a[9],
      'len', a[3])
  end
  if k[5] then
    redis.call('SADD', k[5], a[9])
    if k[7] and a[15] ~= '' then
      redis.call('ZADD', k[7], a[15], a[9])
    end
  end
end
