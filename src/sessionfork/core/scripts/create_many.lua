-- Create the records of many children of one parent from one seed, as create.lua does for each
-- (one script call for a chunk of a fan-out's children, where each took its own call), on one
-- server: the children's keys and the parent's share a server (never a cluster's slots).
-- KEYS[1] = sf:lifecycle, KEYS[2] = the parent's sf:s:{<parent>}:children, KEYS[3] = the parent's
--           record sf:s:{<parent>}, then each child's record (create.lua's KEYS[1]: a child without
--           edits of its own writes neither its log nor its turn index)
-- ARGV    = create.lua's ARGV without instance, session id and edits (a plain child of one seed:
--           the names in core/lua.py's SCRIPTS, pinned by a test), then for each child: its
--           instance token and its session id
-- Returns for each child, in order, what create.lua returns for it. The parent is checked once,
-- for the first child whose id is free (nothing here changes it); the children created are
-- indexed under it in one SADD.
--#include lib/create.lua
local a = {ARGV[1], '', ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], '', ARGV[8], ARGV[9],
  ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[16], ARGV[17], ARGV[18]}
local out, created, ok = {}, {}, nil
local at = 19
for i = 4, #KEYS do
  local k = {KEYS[i], nil, nil, KEYS[1], nil, KEYS[3]}
  a[2], a[9] = ARGV[at], ARGV[at + 1]
  at = at + 2
  local found = existing(k, a)
  if found ~= nil then
    out[#out + 1] = found
  else
    if ok == nil then ok = parent_ok(k, a) end
    if ok then
      create_record(k, a)
      created[#created + 1] = a[9]
      out[#out + 1] = 1
    else
      out[#out + 1] = -1
    end
  end
end
if #created > 0 then redis.call('SADD', KEYS[2], unpack(created)) end
return out
