-- Move a LangGraph thread's pointer from one session to another, only if it still names the first.
-- KEYS[1]  the thread's pointer (keys.langgraph_thread)
-- ARGV[1]  the session id it must hold now
-- ARGV[2]  the session id it holds afterwards ("": the pointer is removed)
-- Returns 1 when moved, 0 when the pointer named another session (or none).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return 1
