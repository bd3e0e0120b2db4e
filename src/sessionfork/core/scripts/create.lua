-- Create a session record if its id is free: a new session (len 0) or a forked child, with the
-- child's edits (events appended right after its seed) in the same atomic step.
-- KEYS[1] = sf:s:{<id>}      (the new session's record)
-- KEYS[2] = sf:s:{<id>}:log, KEYS[3] = sf:s:{<id>}:turns   (the new session's own events and turn
--           index: written only for edits)
-- KEYS[4] = sf:lifecycle, KEYS[5] = the parent's sf:s:{<parent>}:children
--           (both optional: given only when they share the server, i.e. not on a cluster, where
--           the registry pins the child under its parent first (pin.lua) and emits the event after)
-- KEYS[6] = the parent's record sf:s:{<parent>}   (optional, with KEYS[5]: a forked child on one server)
-- KEYS[7] = the parent's sf:s:{<parent>}:needs     (optional, with KEYS[6]: a summary child on one server)
-- ARGV    = header (the record's "header" field: lib/header.lua), instance token, len (seed + edits), seedlen, seed JSON, last type, request
--           id ("" = none), lifecycle stream MAXLEN, session id, seed end: seq of the newest
--           turn/end of the seed (-1: none; "": unknown, the record gets no turn index, as one
--           written before it existed), the parent's header JSON as the source step read it (used
--           with KEYS[6]), last end: seq of the newest turn/end of seed + edits ("" = the seed
--           end), the edits' turn-index entries ("2*seq + (1 for turn/end)", space-separated),
--           the summary child's session/summary event (stored JSON, its seq 0; "" = not one: the
--           seed's slice ["@<id>", 0, 1] reads it from field "summary"), need: the first seq of
--           the parent the child reads (a summary child's keepFrom, recorded in KEYS[7] with the
--           pin; "" = 0, all), cwd ("" = none, else "=" followed by the cwd: the compact layout's
--           "cwd" field), parent id ("" = none: the compact layout's "parent" field), the parent's
--           header as its compact record holds it (used with KEYS[6]: its "header" field, its "cwd"
--           field as the cwd argument writes it, its "parent" field or ""), then the edits' stored
--           JSON (none for a plain child)
-- Returns 1 for a record created now (the caller has the header it sent); the header (wire JSON) of
-- the record under KEYS[1] when it was ours already (created earlier by the same request id: a
-- replay, or by this very call: a client's retry after a lost reply, recognised by the fresh
-- instance token); false when another owner has the id, or -1 when
-- the parent is not the session the source step read, or is shorter than the seed (the server
-- restarted empty, or lost writes in a failover): the seed could not be read, so no child.
-- A deleted parent (a tombstone: no header) is not the session read either: the fork fails
-- SESSION_NOT_FOUND, and a deleted log is never a new child's seed. A replay never appends the
-- edits again: they exist only together with the record.
--#include lib/create.lua
local found = existing(KEYS, ARGV)
if found ~= nil then return found end
if KEYS[6] and not parent_ok(KEYS, ARGV) then return -1 end
create_record(KEYS, ARGV)
return 1
