-- A session's turn index (its sf:s:{<id>}:turns list: 2*seq + (1 for turn/end) of each turn marker
-- of its own events, ascending, append-only), read by binary search. Included by the scripts that
-- tell where an event stands (snapshot, turn, merge_read: core/lua.py expands the include).
local function newest(turns, seq)  -- the newest marker at or before seq, or nil (none)
  local lo, hi, found = 0, redis.call('LLEN', turns) - 1, nil
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local v = tonumber(redis.call('LINDEX', turns, mid))
    if math.floor(v / 2) <= seq then found = v; lo = mid + 1 else hi = mid - 1 end
  end
  return found
end
