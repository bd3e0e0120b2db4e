-- The persistence backend holds the first ARGV[1] events of this session durably: remember it, so
-- that a deletion that waits for the backend (SESSIONFORK_DELETE_AFTER_PERSIST) may proceed.
-- KEYS[1] = sf:s:{<id>}   (one slot)
-- Returns 1 when recorded, 0 when the session is deleted or never existed (nothing is created).
if redis.call('HEXISTS', KEYS[1], 'header') == 0 then return 0 end
local now = tonumber(redis.call('HGET', KEYS[1], 'persisted') or '-1')
if tonumber(ARGV[1]) > now then redis.call('HSET', KEYS[1], 'persisted', ARGV[1]) end
return 1
