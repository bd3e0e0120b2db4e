"""A producer in "any language": only raw Redis commands, no rq or sessionfork import.

Usage: python raw_producer.py PORT SOURCE CHILD REQUEST_ID [BOUNDARY]  -> prints the reply JSON.
It follows the README's "Any-language enqueue" recipe step by step.
"""

import json
import sys
import time

import redis

port, source, child, request_id = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
r = redis.Redis(port=int(port))
fields = {"requestId": request_id, "source": source, "sessionId": child}
if len(sys.argv) > 5:
    fields["boundary"] = int(sys.argv[5])  # fork at this event seq (an integer)
request = json.dumps(fields)
data = json.dumps(["sessionfork.jobs.fork", None, [request], {}])
now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())

ENQUEUE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
"""

# 1. Subscribe to the reply channel first, so no reply can slip by.
pubsub = r.pubsub(ignore_subscribe_messages=True)
pubsub.subscribe("sf:replies")
# 2. Enqueue: the job hash, then the job id on the queue, atomically and only once per request id.
r.execute_command(
    "EVAL", ENQUEUE, 2, f"rq:job:{request_id}", "rq:queue:sessionfork", request_id,
    "data", data, "origin", "sessionfork", "status", "queued", "created_at", now, "enqueued_at", now,
    "timeout", "30", "retries_left", "3", "result_ttl", "604800", "failure_ttl", "604800",
    "description", "sessionfork.jobs.fork",
)
# 3. The reply: stored under the request id (a late waiter reads it there), or published.
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    stored = r.execute_command("HGET", f"sf:req:{request_id}", "outcome")
    if stored:
        print(stored.decode())
        sys.exit(0)
    message = pubsub.get_message(timeout=0.5)
    if message and json.loads(message["data"])["requestId"] == request_id:
        print(message["data"].decode())
        sys.exit(0)
sys.exit("no reply")
