-- Ask the persistence backend for a flush of a session, at most once per interval: deletions that
-- wait for the backend (a retention pass, a polling `delete`) ask again and again; the stream gets
-- one entry per session per interval (the consumer group keeps it until the backend reads it).
-- KEYS[1] = sf:s:{<id>}:flushasked   (the session's slot)
-- KEYS[2] = sf:lifecycle   (optional: given only when it shares the server, i.e. not on a cluster)
-- ARGV    = interval (ms), lifecycle stream MAXLEN, session id, len
-- Returns 1 when the flush is asked now (on a cluster: the caller appends the entry), 0 when one
-- was asked within the interval.
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return 0 end
if KEYS[2] then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'type', 'session/flush', 'id', ARGV[3], 'len', ARGV[4])
end
return 1
