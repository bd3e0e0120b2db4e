"""A producer in "any language": only raw Redis commands, no rq or sessionfork import.

Usage: python raw_producer.py PORT[,PORT...] SOURCE CHILD REQUEST_ID [RESULT_TTL [BOUNDARY [ROUTE [FIELDS]]]]
(prints the reply).
FIELDS: a JSON object of more request fields (``ifLength``, ``edits``, ``variants``) merged into the
request; with ``variants`` the CHILD argument is ignored (a variant fan-out names its children); with
``"op": "merge"`` or ``"select"`` SOURCE and CHILD are (FIELDS names the parent and child or candidates).
It follows the README's "Any-language enqueue" recipe step by step; ENQUEUE is the shipped script,
read as a file (``src/sessionfork/protocol/scripts/enqueue.lua``, the recipe's script: a test checks
they are the same text), not imported from sessionfork. ROUTE ``eval``
(default) sends it with EVAL and reads the reply with EVAL of the shipped ``outcome.lua``; ``fcall``
calls the loaded library's ``sf_enqueue`` and ``sf_outcome`` instead. Several
ports: a sharded queue, the servers in shard order; the request goes to (and is awaited on) the
shard the recipe's routing function names, computed here without sessionfork.
"""

import json
import sys
import time
import zlib
from pathlib import Path

import redis


def shard_of(request_id: str, n: int) -> int:
    """Step 0 of the recipe: jump consistent hash of the CRC-32 of the id's UTF-8 bytes."""
    key, b, j = zlib.crc32(request_id.encode("utf-8")), -1, 0
    while j < n:
        b = j
        key = (key * 2862933555777941757 + 1) % 2**64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


ports, source, child, request_id = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
result_ttl = sys.argv[5] if len(sys.argv) > 5 else "604800"
r = redis.Redis(port=int(ports[shard_of(request_id, len(ports))]))
fields = {"requestId": request_id, "source": source, "sessionId": child}
if len(sys.argv) > 6 and sys.argv[6]:
    fields["boundary"] = int(sys.argv[6])  # fork at this event seq (an integer)
route = sys.argv[7] if len(sys.argv) > 7 and sys.argv[7] else "eval"
if len(sys.argv) > 8:
    fields.update(json.loads(sys.argv[8]))  # e.g. {"ifLength": 8, "edits": [{"type": ..., "data": ...}]}
    if "variants" in fields:
        del fields["sessionId"]
    if fields.get("op") in ("merge", "select"):  # a merge or select names its sessions in FIELDS
        del fields["source"], fields["sessionId"]
request = json.dumps(fields)
now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())

# The enqueue script as shipped (the README's), read where this file sits in the source tree.
ENQUEUE = (Path(__file__).resolve().parents[2] / "src/sessionfork/protocol/scripts/enqueue.lua").read_text()

# 1. Subscribe to the reply channel first, so no reply can slip by.
pubsub = r.pubsub(ignore_subscribe_messages=True)
pubsub.subscribe("sf:replies")
# 2. Enqueue atomically, once per request id; -1: the id was used for a different request.
enqueued = r.execute_command(
    *(("FCALL", "sf_enqueue") if route == "fcall" else ("EVAL", ENQUEUE)),
    3, f"rq:job:{request_id}", "rq:queue:sessionfork", f"sf:req:{request_id}",
    request_id, request, "origin", "sessionfork", "status", "queued", "created_at", now, "enqueued_at", now,
    "timeout", "30", "retries_left", "3", "result_ttl", result_ttl, "failure_ttl", "604800",
    "description", "sessionfork.jobs.fork",
)
if enqueued == -1:
    print(json.dumps({"type": "fork/error", "requestId": request_id, "ok": False, "code": "IDEMPOTENCY_CONFLICT",
                      "message": f'request id "{request_id}" was already used for a different request'}))
    sys.exit(0)
# 3. The reply is the outcome stored under the request id, read with one call (the loaded library's
#    sf_outcome, or the shipped outcome.lua as EVAL): its JSON, or nil while none is stored. A message
#    naming the request only says "read it now" (anyone may publish on a channel: never the answer).
OUTCOME = (Path(__file__).resolve().parents[2] / "src/sessionfork/protocol/scripts/outcome.lua").read_text()
read = ("FCALL", "sf_outcome") if route == "fcall" else ("EVAL", OUTCOME)

deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    outcome = r.execute_command(*read, 1, f"sf:req:{request_id}")
    if outcome:
        print(outcome.decode())
        sys.exit(0)
    message = pubsub.get_message(timeout=0.5)
    if message:
        try:
            reply = json.loads(message["data"])
        except ValueError:
            continue  # anyone may publish on a channel: not a reply
        if isinstance(reply, dict) and reply.get("requestId") == request_id:
            continue  # woken: the stored outcome is read at the top of the loop
sys.exit("no reply")
