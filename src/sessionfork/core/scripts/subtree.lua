-- One level of a subtree's usage walk (Registry.usage), on one server: the sum of the own usage
-- counters of the level's sessions and the ids one level below.
-- KEYS    = for each session of the level: sf:s:{<id>}, sf:s:{<id>}:children
-- Returns {inputTokens, outputTokens, cacheReadTokens, cacheWriteTokens, costMicros, child id...}
-- where the sums are decimal strings (exact up to 2^53 each).
local sums = {0, 0, 0, 0, 0}
local below = {}
for i = 1, #KEYS, 2 do
  local got = redis.call('HMGET', KEYS[i], 'uin', 'uout', 'ucr', 'ucw', 'ucost')
  for j = 1, 5 do
    if got[j] then sums[j] = sums[j] + tonumber(got[j]) end
  end
  for _, child in ipairs(redis.call('SMEMBERS', KEYS[i + 1])) do below[#below + 1] = child end
end
local out = {}
for j = 1, 5 do out[j] = string.format('%.0f', sums[j]) end
for _, child in ipairs(below) do out[#out + 1] = child end
return out
