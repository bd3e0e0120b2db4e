-- What a refused merge or select held, let go: its plan and its holds (lib/hold.lua), so that a
-- refusal leaves no field behind.
-- KEYS    = each session's record sf:s:{<id>} (one slot on a cluster: one call per record)
-- ARGV    = the holder (the request id, or the call's token)
-- Returns the number of records.
--#include lib/hold.lua
for i = 1, #KEYS do let_go(KEYS[i], ARGV[1]) end
return #KEYS
