-- A session header in its record (core/records.py writes and reads the same layouts; a test pins
-- the two): compact, "header" = [version, createdAt(, seedLength(, keptFrom))] (seedLength null when
-- absent but keptFrom given), "cwd" and "parent" (the parent's id) only if set, the id the key's;
-- or old, "header" = one JSON object. Included by the scripts that read headers (core/lua.py).
local function header_of(raw, cwd, parent)  -- a table of the wire names, or nil (no header)
  if not raw then return nil end
  if string.sub(raw, 1, 1) == '{' then return cjson.decode(raw) end
  local a = cjson.decode(raw)
  local h = {version = a[1], createdAt = a[2], cwd = cwd or nil, parentSession = parent or nil}
  if a[3] ~= nil and a[3] ~= cjson.null then h['seedLength'] = a[3] end
  if a[4] ~= nil and a[4] ~= cjson.null then h['keptFrom'] = a[4] end
  return h
end
local function json_text(s)  -- a JSON string as msgspec writes it ("/" unescaped)
  return (string.gsub(cjson.encode(s), '\\/', '/'))
end
local function header_json(id, raw, cwd, parent)  -- the wire JSON of a header (old: as stored)
  if string.sub(raw, 1, 1) == '{' then return raw end
  local h = header_of(raw, cwd, parent)
  local out = {'{"version":', string.format('%d', h['version']), ',"id":', json_text(id), ',"createdAt":',
    string.format('%d', h['createdAt'])}
  if h['cwd'] then out[#out + 1] = ',"cwd":' .. json_text(h['cwd']) end
  if h['parentSession'] then out[#out + 1] = ',"parentSession":' .. json_text(h['parentSession']) end
  if h['seedLength'] then out[#out + 1] = ',"seedLength":' .. string.format('%d', h['seedLength']) end
  if h['keptFrom'] then out[#out + 1] = ',"keptFrom":' .. string.format('%d', h['keptFrom']) end
  out[#out + 1] = '}'
  return table.concat(out)
end
local function same_header(a, b)  -- two header tables, the id aside
  for _, k in ipairs({'version', 'createdAt', 'cwd', 'parentSession', 'seedLength', 'keptFrom'}) do
    if a[k] ~= b[k] then return false end
  end
  return true
end
