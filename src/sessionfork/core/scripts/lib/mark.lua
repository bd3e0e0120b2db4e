-- mark.lua's step, shared with mark_many.lua (which runs it for each of many records): a merged or
-- abandoned session's state in its record ``record``, and what the request held on it let go
-- (lib/hold.lua, included first). Returns whether the record exists (a record deleted meanwhile:
-- nothing to mark).
local function mark_record(record, kind, value, holder)
  if redis.call('HEXISTS', record, 'header') == 0 then return false end
  if kind == 'merged' then
    redis.call('HSET', record, 'mergedinto', value)
  else
    redis.call('HSETNX', record, 'abandoned', value)
  end
  let_go(record, holder)
  return true
end
