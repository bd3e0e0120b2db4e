-- What a merge or a select holds on a session while it runs (its record's fields; core/keys.py),
-- so that two requests that would change one session's state never both succeed: a merge holds
-- its child ('plan:<holder>' = "<fromSeq> <toSeq> <ms>", the range it resolved, which its retry
-- merges again), a select each of its candidates ('hold' = "<holder> <ms>"). The holder is the
-- request id (a call without one: a token of its own, starting with "."). A hold is let go when
-- its request ends (the marks; unhold.lua for a refusal) and counts for the request window only
-- (the outcome TTL, in ms): a request that died and is never run again holds nothing after it.
-- Included by merge_read.lua, hold.lua, unhold.lua and the marks (core/lua.py expands the include).
local function live(value, now, window)  -- a hold taken within the window (its value's last word: ms)
  local at = tonumber(string.match(value, '(%d+)$'))
  return at ~= nil and now - at < window
end
local function holder_of(value) return string.match(value, '^(%S+)') end
local function held_by(record, holder, now, window, plans)
  -- Another request that holds the record: a select's hold, and (plans: a select asks) a merge's
  -- plan; nil when none does.
  if not plans then
    local h = redis.call('HGET', record, 'hold')
    if h and holder_of(h) ~= holder and live(h, now, window) then return holder_of(h) end
    return nil
  end
  local all = redis.call('HGETALL', record)
  for i = 1, #all, 2 do
    local k, v = all[i], all[i + 1]
    if k == 'hold' then
      if holder_of(v) ~= holder and live(v, now, window) then return holder_of(v) end
    elseif string.sub(k, 1, 5) == 'plan:' then
      local by = string.sub(k, 6)
      if by ~= holder and live(v, now, window) then return by end
    end
  end
  return nil
end
local function refusal(record, id, holder, now, window)
  -- A select's candidate: nil when the select may hold it, else why not: {"NOT_FOUND", id} /
  -- {"ABANDONED", id, request id} / {"MERGED", id, its mergedinto} / {"BUSY", id, holder}
  local r = redis.call('HMGET', record, 'header', 'abandoned', 'mergedinto')
  if not r[1] then return {'NOT_FOUND', id} end
  if r[2] and r[2] ~= holder then return {'ABANDONED', id, r[2]} end
  if r[3] and cjson.decode(r[3])[3] ~= holder then return {'MERGED', id, r[3]} end
  local by = held_by(record, holder, now, window, true)
  if by then return {'BUSY', id, by} end
  return nil
end
local function let_go(record, holder)  -- what holder holds on the record, let go
  redis.call('HDEL', record, 'plan:' .. holder)
  local h = redis.call('HGET', record, 'hold')
  if h and holder_of(h) == holder then redis.call('HDEL', record, 'hold') end
end
