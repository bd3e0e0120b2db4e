-- Delete a session: its record becomes a tombstone (the id is never reused), its own log is freed
-- unless a descendant may still read it (its children index is not empty: then the log and the
-- seed references stay, and are freed by release.lua when the last descendant is gone; the caller
-- runs release.lua on it at once to free what no descendant reads, as summary children keep only
-- their kept range).
-- KEYS[1] = sf:s:{<id>}, KEYS[2] = sf:s:{<id>}:log, KEYS[3] = sf:s:{<id>}:children,
-- KEYS[4] = sf:s:{<id>}:persisted, KEYS[5] = sf:s:{<id>}:turns   (one slot)
-- KEYS[6] = sf:lifecycle   (optional: given only when it shares the server, i.e. not on a cluster)
-- ARGV    = now (epoch ms), lifecycle stream MAXLEN, session id, "1" = only if disposed (retention),
--           "1" = only if the persistence backend holds the whole log (KEYS[4] >= len)
-- Returns {1, parent id or "", descendants left, header (wire JSON)} when deleted now; {-1} not found (never created,
-- or deleted already); {-2} live and ARGV[4] is "1"; {-3, len, persisted} not persisted yet.
--#include lib/header.lua
local r = redis.call('HMGET', KEYS[1], 'header', 'instance', 'len', 'seed', 'seedlen', 'lastend', 'seedend',
  'summary', 'cwd', 'parent')
local names = {'uin', 'uout', 'ucr', 'ucw', 'ucost', 'tin', 'tout', 'tcr', 'tcw', 'tcost', 'tree'}
local usage = redis.call('HMGET', KEYS[1], unpack(names))
local persisted = redis.call('GET', KEYS[4])
if not r[1] then return {-1} end
r[5] = r[5] or r[3]  -- absent until the first append (create.lua)
if r[6] then r[7] = r[7] or r[6] end
if ARGV[4] == '1' and r[2] then return {-2} end
if ARGV[5] == '1' and tonumber(persisted or '-1') < tonumber(r[3]) then return {-3, r[3], persisted or '-1'} end
local header = header_of(r[1], r[9], r[10])
local text = header_json(ARGV[3], r[1], r[9], r[10])
local parent = header['parentSession']
if type(parent) ~= 'string' then parent = '' end
local left = redis.call('SCARD', KEYS[3])
redis.call('DEL', KEYS[1], KEYS[4])
if left == 0 then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[5])
end
redis.call('HSET', KEYS[1], 'deleted', ARGV[1])
-- usage: the tombstone keeps the counters it has, its own and, a root's, its tree's totals with
-- its "tree" mark (a root's total counts its deleted descendants, and goes on summing its tree's
-- appends once it is deleted itself); nothing when it has none
local totals = false
for i = 1, 10 do
  if usage[i] then
    redis.call('HSET', KEYS[1], names[i], usage[i])
    if i > 5 then totals = true end
  end
end
if totals and usage[11] then redis.call('HSET', KEYS[1], 'tree', usage[11]) end
if left > 0 then
  -- Kept while the log is pinned: descendants resolve their reference to this seed, check a
  -- boundary in these events on the turn index (turn.lua), and the last descendant's release
  -- reaches the parent.
  redis.call('HSET', KEYS[1], 'seed', r[4], 'seedlen', r[5])
  -- a summary child's seq 0: its descendants read it from here (the slice ["@<id>", 0, 1])
  if r[8] then redis.call('HSET', KEYS[1], 'summary', r[8]) end
  if r[6] then redis.call('HSET', KEYS[1], 'lastend', r[6], 'seedend', r[7] or '-1') end
  if parent ~= '' then redis.call('HSET', KEYS[1], 'parent', parent) end
  -- a summary child's keepFrom: release.lua maps what its descendants read to its parent's seqs
  if type(header['keptFrom']) == 'number' then redis.call('HSET', KEYS[1], 'keptfrom', header['keptFrom']) end
end
if KEYS[6] then
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[2], '*', 'type', 'session/deleted', 'id', ARGV[3],
    'len', r[3], 'header', text)
end
return {1, parent, left, text}
