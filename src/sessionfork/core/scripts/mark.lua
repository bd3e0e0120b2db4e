-- A merged or abandoned session's state, in its record (the child's step after the parent's).
-- KEYS[1] = sf:s:{<id>}
-- KEYS[2] = sf:ended   (optional: given only when it shares the server, i.e. not on a cluster)
-- ARGV    = "merged" or "abandoned", the value (merged: the record's "mergedinto", JSON [parent,
--           seq, request id]; abandoned: the request id), now (epoch ms), the session id, the
--           holder (the request id, or the call's token: what it held is let go)
-- Idempotent (a retried request marks again): "abandoned" keeps its first request id, "mergedinto"
-- holds the latest merge, and the ended index keeps the first time (ZADD NX). Returns 1, or 0 when
-- the record is gone (deleted meanwhile: nothing to mark).
--#include lib/hold.lua
--#include lib/mark.lua
if not mark_record(KEYS[1], ARGV[1], ARGV[2], ARGV[5]) then return 0 end
if KEYS[2] then redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[4]) end
return 1
