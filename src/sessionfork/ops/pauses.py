"""Pause and resume a shard's queue, and the audit trail of those actions.

A shard is one queue server. Its pause is RQ's worker suspension (``protocol.rq_layout.SUSPENDED``,
the key ``rq suspend`` sets): while it exists, every worker of that server finishes the job it
holds and takes no new one (an idle worker sees it within a second), and producers still enqueue.
Resuming deletes it; the workers take jobs again within a second. ``rq suspend`` and ``rq resume``
do the same, so either tool may undo the other's pause. Suspension rather than a key of
sessionfork's own: the worker loop already honours it between jobs (RQ's check, read for free by
each job's finish), ``rq info`` and rq-dashboard show a suspended worker as such, and a second key
would need a second check in the loop. Its scope is the server: on a server shared with other RQ
queues it pauses their workers too.

Each pause and resume appends an entry to the server's audit stream (``keys.AUDIT_STREAM``, capped
at ``AUDIT_MAX`` entries), in the same transaction as the change itself.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..core import keys, wire
from ..protocol import rq_layout

AUDIT_MAX = 1000
"""Audit entries kept per server (approximately: ``XADD MAXLEN ~``)."""


class AuditEntry(msgspec.Struct, rename="camel", kw_only=True):
    """One action on a shard's queue: when (epoch ms, the stream entry's time), what, by whom."""

    id: str
    time: int
    action: str
    actor: str
    detail: str = ""
    shard: int = 0


def is_paused(redis: Any) -> bool:
    """Whether the queue server of ``redis`` is paused (its workers take no new job)."""
    return bool(redis.exists(rq_layout.SUSPENDED))


def pause(redis: Any, actor: str, detail: str = "") -> None:
    """Pause the queue server of ``redis`` and audit it (one transaction); pausing twice is harmless."""
    _act(redis, "pause", actor, detail)


def resume(redis: Any, actor: str, detail: str = "") -> None:
    """Resume the queue server of ``redis`` and audit it (one transaction); resuming twice is harmless."""
    _act(redis, "resume", actor, detail)


def _act(redis: Any, action: str, actor: str, detail: str) -> None:
    pipe = redis.pipeline(transaction=True)
    if action == "pause":
        pipe.set(rq_layout.SUSPENDED, 1)
    else:
        pipe.delete(rq_layout.SUSPENDED)
    pipe.xadd(keys.AUDIT_STREAM, {"action": action, "actor": actor, "detail": detail},
              maxlen=AUDIT_MAX, approximate=True)
    pipe.execute()


def audit(redis: Any, count: int = 50, shard: int = 0) -> list[AuditEntry]:
    """The newest ``count`` audit entries of one server, newest first, tagged with ``shard``."""
    entries = []
    for entry_id, fields in redis.xrevrange(keys.AUDIT_STREAM, count=count):
        text = {wire.text(k): wire.text(v) for k, v in fields.items()}
        eid = wire.text(entry_id)
        entries.append(AuditEntry(id=eid, time=int(eid.split("-")[0]), action=text.get("action", ""),
                                  actor=text.get("actor", ""), detail=text.get("detail", ""), shard=shard))
    return entries
