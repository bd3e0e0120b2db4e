"""The soak's audit (``bench.soak``): what a run left on the server, read back and checked.

``sample`` takes the memory samples the run is judged by (``bytes_per_child`` between two of them);
``tally_outcomes`` reads the outcome stream's entries of the run's requests; ``count_bad_seeds``
checks the children they created against their parents' logs.
"""

from __future__ import annotations

import collections
import random
from typing import Any

from redis import Redis

from sessionfork.core import keys, rules, wire
from sessionfork.core.registry import Registry
from sessionfork.core.snapshots import decode_segments
from sessionfork.core.wire import ForkResult, Header
from sessionfork.protocol.outcomes import stream_entry


def sample(redis: Redis, sources: list[str]) -> tuple[int, int]:
    """(used_memory without client buffers and the sources' own logs, children created so far)."""
    info = redis.info("memory")
    own = sum(int(redis.memory_usage(keys.session_log(s), samples=0) or 0) for s in sources)
    children = sum(int(redis.scard(keys.session_children(s))) for s in sources)
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0)) - own, children


def bytes_per_child(a: tuple[int, int], b: tuple[int, int]) -> float:
    """Memory growth per child created between the ``sample``s ``a`` and ``b`` (0.0 if none was)."""
    return (b[0] - a[0]) / (b[1] - a[1]) if b[1] > a[1] else 0.0


def count_bad_seeds(registry: Registry, created: list[Header], *, materialise: int = 300) -> int:
    """How many children have a log that is not their parent's log cut at a turn/end (or empty).

    Every child is checked by its record: its seed must reference exactly its parent's log up to
    ``seedLength`` (the references *are* its events: logs are append-only), the parent's event at
    ``seedLength - 1`` must be a ``turn/end``, and it must have no events of its own. A random
    sample of ``materialise`` children is also read event by event and compared with the parent.
    """
    parents = {p: registry.events(p) for p in {h.parent_session for h in created} if isinstance(p, str)}
    records: dict[str, Any] = {}
    for p in parents:  # "seedlen" is absent until a session's first append: it is "len" until then
        seedlen, stored, length = registry.redis.hmget(keys.session(p), ["seedlen", "seed", "len"])
        records[p] = (seedlen if seedlen is not None else length, stored)
    pipe = registry.redis.pipeline(transaction=False)
    for header in created:
        pipe.hmget(keys.session(header.id), ["len", "seed"])
        pipe.exists(keys.session_log(header.id))
    raw = pipe.execute()
    bad: set[str] = set()
    for i, header in enumerate(created):
        parent, seed = header.parent_session, header.seed_length
        if not isinstance(parent, str) or parent not in parents or not isinstance(seed, int) or raw[2 * i + 1]:
            bad.add(header.id)
            continue
        length, segments = raw[2 * i]
        parent_seedlen, parent_segments = records[parent]
        expected = rules.by_reference(parent, rules.child_segments(
            parent, [list(s) for s in decode_segments(parent_segments)], int(parent_seedlen), seed))
        boundary = seed == 0 or parents[parent][seed - 1].type == "turn/end"
        if int(length) != seed or [list(s) for s in decode_segments(segments)] != expected or not boundary:
            bad.add(header.id)
    for header in random.sample(created, min(materialise, len(created))):
        parent, seed = header.parent_session, header.seed_length
        if isinstance(parent, str) and isinstance(seed, int) and registry.events(header.id) != parents[parent][:seed]:
            bad.add(header.id)
    return len(bad)


def tally_outcomes(redis: Redis, mine: set[str], since_ms: int
              ) -> tuple[collections.Counter[str], collections.Counter[str], list[Header]]:
    """Outcome stream entries of ``mine`` per request and per code, and the children they created."""
    per_request: collections.Counter[str] = collections.Counter()
    by_code: collections.Counter[str] = collections.Counter()
    created: list[Header] = []
    entries: list[Any] = redis.xrange(keys.OUTCOME_STREAM, min=f"{since_ms}-0") or []
    for _, fields in entries:
        entry = stream_entry(fields)
        rid = entry["requestId"].decode()
        if rid in mine:
            per_request[rid] += 1
            by_code[entry["code"].decode()] += 1
            reply = wire.decode_reply(entry["reply"])
            if isinstance(reply, ForkResult):
                created += [reply.session] if isinstance(reply.session, Header) else []
                created += reply.sessions if isinstance(reply.sessions, list) else []
    return per_request, by_code, created
