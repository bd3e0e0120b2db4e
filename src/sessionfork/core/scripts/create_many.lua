-- Create the records of many children of one parent from one seed, as create.lua does for each
-- (one script call for a chunk of a fan-out's children, where each took its own call), on one
-- server: the children's keys and the parent's share a server (never a cluster's slots).
-- KEYS[1] = sf:lifecycle, KEYS[2] = the parent's sf:s:{<parent>}:children, KEYS[3] = the parent's
--           record sf:s:{<parent>}, then each child's keys in order: a child without edits of its
--           own its record only (create.lua's KEYS[1]: it writes neither log nor turn index), a
--           child with edits its record, log and turn index (create.lua's KEYS[1..3])
-- ARGV    = create.lua's ARGV without instance, session id and edits (the names in core/lua.py's
--           SCRIPTS, pinned by a test), then for each child: its instance token, its session id
--           and the count N of its own edits; a child with edits (N > 0) then its length, last
--           type, last end and turn-index entries (create.lua's ARGV[3], [6], [12], [13]) and its
--           N edits' stored JSON
-- Returns for each child, in order, what create.lua returns for it. The parent is checked once,
-- for the first child whose id is free (nothing here changes it); the children created are
-- indexed under it in one SADD. One EXISTS over every child's keys first: when none exists (a new
-- fan-out, the usual case), no child needs a look of its own (one call, where each took one).
--#include lib/create.lua
local shared = {ARGV[1], '', ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], '', ARGV[8], ARGV[9],
  ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[16], ARGV[17], ARGV[18]}
local out, created, ok = {}, {}, nil
local plain = nil  -- the plain children's record fields, built once (record_fields), each child's token set
local at, i = 19, 4
local fresh = redis.call('EXISTS', unpack(KEYS, 4)) == 0
while i <= #KEYS do
  local n = tonumber(ARGV[at + 2])
  local k, a
  if n == 0 then
    k, a = {KEYS[i], nil, nil, KEYS[1], nil, KEYS[3]}, shared
    i = i + 1
  else
    k, a = {KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[1], nil, KEYS[3]}, {unpack(shared)}
    i = i + 3
    a[3], a[6], a[12], a[13] = ARGV[at + 3], ARGV[at + 4], ARGV[at + 5], ARGV[at + 6]
    for j = 1, n do a[20 + j] = ARGV[at + 6 + j] end
  end
  a[2], a[9] = ARGV[at], ARGV[at + 1]
  at = at + 3 + (n == 0 and 0 or 4 + n)
  local found = nil
  if not fresh then found = existing(k, a) end
  if found ~= nil then
    out[#out + 1] = found
  else
    if ok == nil then ok = parent_ok(k, a) end
    if ok then
      if n == 0 then
        plain = plain or record_fields(a)
        plain[4] = a[2]
        create_record(k, a, plain)
      else
        create_record(k, a)
      end
      created[#created + 1] = a[9]
      out[#out + 1] = 1
    else
      out[#out + 1] = -1
    end
  end
end
if #created > 0 then redis.call('SADD', KEYS[2], unpack(created)) end
return out
