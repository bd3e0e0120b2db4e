-- Enqueue a request (a fork, a merge or a select) as an RQ job, once per request id, from any language (the README's
-- any-language recipe; the Python clients enqueue with it too, as EVALSHA or as FCALL sf_enqueue).
-- KEYS[1] = rq:job:<request id>, KEYS[2] = rq:queue:<queue>, KEYS[3] = sf:req:<request id>,
-- KEYS[4] (optional) = rq:queues, the set of queue keys RQ lists (rq info, rq-dashboard)
-- ARGV    = request id, request JSON, then the job hash's other fields and values
--           (origin, status, created_at, enqueued_at, timeout, retries_left, result_ttl, ...);
--           without a "data" field, data is the JSON job [sessionfork.jobs.fork, null, [request], {}]
-- Returns  1 enqueued;
--          0 the same request (the same values of FIELDS below: a fork's source, sessionId, count,
--            sessionIds, boundary, ifLength, edits, variants and summary; a merge's or select's op, parent,
--            child, mode, summary, range, ifParentLength, ifChildLength, candidates and winner; replyTo may
--            differ) is queued or done: its one outcome answers this submission too;
--         -1 the request id was used for a different request: IDEMPOTENCY_CONFLICT, nothing
--            enqueued (and nothing will be announced for this submission);
--         an error (nothing written) for malformed arguments, keys of the wrong type, or a request JSON
--            over MAX_REQUEST_BYTES (refused before it is read: no request makes the server BUSY).
-- The job hash keeps the request's identity digest in field sf_identity, whatever its serializer.
local FIELDS = {'source', 'sessionId', 'count', 'sessionIds', 'boundary',  -- core/wire.py IDENTITY
  'ifLength', 'edits', 'variants', 'summary', 'op', 'parent', 'child', 'mode', 'range', 'ifParentLength',
  'ifChildLength', 'candidates', 'winner'}
local OP = 10  -- "op": "fork" is a fork without op, the same request
local KEPT = 4  -- later fields count only up to the last one given: older digests stay as they were
local MAX_REQUEST_BYTES = 65536  -- core/settings.py REQUEST_LIMIT (a test pins the two)
local MAX_DATA_DEPTH = 100  -- core/rules.py MAX_DATA_DEPTH: the worker's depth of edits' data (pinned)
-- canon reads every request the worker accepts: data nested MAX_DATA_DEPTH deep sits at most 5 levels
-- down (variants, a variant, edits, an edit, its data), in a request or in the identity the worker keeps.
local MAX_DEPTH = MAX_DATA_DEPTH + 5
local function canon(s)  -- JSON text -> {kind, value}: canonical text per value, numbers exact
  local i = 1
  local function ws() i = string.find(s, '[^ \t\r\n]', i) or #s + 1 end
  local value
  local function items(close, depth, object)
    local out, map = {}, object and {} or nil  -- an array needs no map: a request may hold 30000 arrays
    i = i + 1
    ws()
    if string.sub(s, i, i) == close then i = i + 1 return out, map end
    while true do
      local key
      if object then
        key = value(depth)
        ws()
        if string.sub(s, i, i) ~= ':' then error('colon') end
        i = i + 1
      end
      local v = value(depth)
      if object then map[key] = v else out[#out + 1] = v end
      ws()
      local c = string.sub(s, i, i)
      i = i + 1
      if c == close then break elseif c ~= ',' then error('separator') end
    end
    if object then
      for k, v in pairs(map) do out[#out + 1] = k .. ':' .. v end
      table.sort(out)
    end
    return out, map
  end
  value = function(depth)
    if depth > MAX_DEPTH then error('too deep') end
    ws()
    local c = string.sub(s, i, i)
    if c == '"' then
      local j, escaped = i + 1, false
      while true do
        local q = string.find(s, '["\\]', j)
        if not q then error('string') end
        if string.sub(s, q, q) == '"' then j = q break end
        j, escaped = q + 2, true
      end
      local text = escaped and cjson.decode(string.sub(s, i, j)) or string.sub(s, i + 1, j - 1)
      if not escaped and string.find(text, '%c') then error('control character') end
      i = j + 1
      return cjson.encode(text)
    elseif c == '{' or c == '[' then
      local close = c == '{' and '}' or ']'
      return c .. table.concat(items(close, depth + 1, c == '{'), ',') .. close
    end
    for word, code in pairs({['true'] = 't', ['false'] = 'f', ['null'] = 'n'}) do
      if string.sub(s, i, i + #word - 1) == word then i = i + #word return code end
    end
    local int = string.match(s, '^-?%d+', i)
    if not int or string.match(int, '^-?0%d') then error('number') end
    local tail = string.match(s, '^%.?%d*[eE]?[-+]?%d*', i + #int)
    i = i + #int + #tail
    if tail ~= '' then return 'd' .. string.format('%.17g', tonumber(int .. tail)) end
    if string.match(int, '^-0+$') then int = '0' end
    return 'i' .. int
  end
  ws()
  local c = string.sub(s, i, i)
  if c ~= '{' and c ~= '[' then error('not an object or array') end
  local list, map = items(c == '{' and '}' or ']', 1, c == '{')
  ws()
  if i <= #s then error('trailing text') end
  return c == '{' and map or list
end
local saw_number = false
local function quick(v)  -- canon's text from cjson's value (numbers checked by the caller)
  local t = type(v)
  if t == 'string' then return cjson.encode(v) end
  if t == 'boolean' then return v and 't' or 'f' end
  if v == nil or v == cjson.null then return 'n' end
  if t == 'number' then
    if v ~= math.floor(v) or math.abs(v) >= 1e15 then error('inexact') end
    saw_number = true
    return 'i' .. string.format('%d', v)
  end
  if next(v) == nil then error('empty') end  -- [] and {} read alike
  local out = {}
  if v[1] ~= nil then
    for n, item in ipairs(v) do
      if type(item) ~= 'string' then out = nil break end
    end
    if out then return cjson.encode(v) end  -- the common case, in C: a list of ids
    out = {}
    for n, item in ipairs(v) do out[n] = quick(item) end
    return '[' .. table.concat(out, ',') .. ']'
  end
  for k, item in pairs(v) do out[#out + 1] = cjson.encode(k) .. ':' .. quick(item) end
  table.sort(out)
  return '{' .. table.concat(out, ',') .. '}'
end
local function identity(text, stored)  -- a digest: equal digests, same request
  local parts = {}
  local ok = pcall(function()  -- cjson: fast, but numbers are doubles (exact when canon agrees)
    local r = cjson.decode(text)
    if type(r) ~= 'table' or (stored and r[1] == nil) or (not stored and r[1] ~= nil) then error('shape') end
    saw_number = false
    for n, name in ipairs(FIELDS) do parts[n] = quick(r[stored and n or name]) end
    if saw_number and string.find(text, '%d[%.eE]') then error('a fraction or exponent') end
  end)
  if not ok then
    local fields
    ok, fields = pcall(canon, text)
    if not ok then return redis.sha1hex('raw:' .. text) end
    for n, name in ipairs(FIELDS) do parts[n] = fields[stored and n or cjson.encode(name)] or 'n' end
  end
  if parts[OP] == '"fork"' then parts[OP] = 'n' end
  local n = #FIELDS
  while n > KEPT + 1 and (parts[n] == nil or parts[n] == 'n') do parts[n] = nil n = n - 1 end
  return redis.sha1hex(table.concat(parts, '\n'))
end
-- Validate everything before writing anything: a malformed call leaves no trace.
if #KEYS < 3 or #KEYS > 4 then return redis.error_reply('ERR enqueue: 3 or 4 keys expected') end
if #ARGV < 2 or #ARGV % 2 ~= 0 then
  return redis.error_reply('ERR enqueue: request id, request JSON, then field value pairs expected')
end
if #ARGV[2] > MAX_REQUEST_BYTES then  -- before anything reads it: its cost is bounded by the limit's
  return redis.error_reply('ERR enqueue: request is ' .. #ARGV[2] .. ' bytes, over the limit of '
    .. MAX_REQUEST_BYTES)
end
if ARGV[1] == '' or string.sub(KEYS[1], -#ARGV[1] - 1) ~= ':' .. ARGV[1] then
  return redis.error_reply('ERR enqueue: KEYS[1] must be the job key of the request id ARGV[1]')
end
for n, kind in ipairs({'hash', 'list', 'hash', 'set'}) do
  if KEYS[n] then
    local t = redis.call('TYPE', KEYS[n])['ok']
    if t ~= kind and t ~= 'none' then
      return redis.error_reply('ERR enqueue: ' .. KEYS[n] .. ' is a ' .. t .. ', not a ' .. kind)
    end
  end
end
local mine = identity(ARGV[2])
local stored = redis.call('HGET', KEYS[3], 'request')  -- kept by the worker when it claims the id
if stored then return identity(stored, true) == mine and 0 or -1 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end  -- refused, or claimed before ids were kept
local job = redis.call('HMGET', KEYS[1], 'sf_identity', 'data')
if job[1] then return job[1] == mine and 0 or -1 end  -- queued, not claimed yet
if job[2] then  -- queued before identities were kept: compare when its data is plain JSON
  -- data over 6 bytes a request byte (a \u00XX escape each) holds a request over the limit: refused by
  -- the worker, never the same as this one (which is within it), and not worth reading
  if #job[2] > 6 * MAX_REQUEST_BYTES + 64 then return -1 end
  local ok, tuple = pcall(cjson.decode, job[2])
  if ok and type(tuple) == 'table' and type(tuple[3]) == 'table' and type(tuple[3][1]) == 'string'
      and (#tuple[3][1] > MAX_REQUEST_BYTES or identity(tuple[3][1]) ~= mine) then
    return -1
  end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local has_data = false
for n = 3, #ARGV, 2 do if ARGV[n] == 'data' then has_data = true end end
if not has_data then
  redis.call('HSET', KEYS[1], 'data', cjson.encode({'sessionfork.jobs.fork', cjson.null, {ARGV[2]}, {}}))
end
if #ARGV >= 4 then redis.call('HSET', KEYS[1], unpack(ARGV, 3)) end
redis.call('HSET', KEYS[1], 'sf_identity', mine)
redis.call('RPUSH', KEYS[2], ARGV[1])
if KEYS[4] then redis.call('SADD', KEYS[4], KEYS[2]) end
return 1
