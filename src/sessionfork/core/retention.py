"""Deletion and retention: remove sessions without changing one byte of any descendant's log.

Design (README, "Storage design"): a child's seed references slices of its ancestors' own logs,
so a deleted session's log is **kept while any descendant is left** and freed when the last one
goes. Its record becomes a tombstone at once (``deleted``: the id answers ``SESSION_NOT_FOUND``
everywhere and is never reused). The children index is the pin: a session stays in its parent's
index until it is deleted *and* has no descendant left, so a non-empty index means "a descendant
may read this log (or an ancestor's)". Each step is one script on one session's slot:

* ``delete.lua`` on the session (``Registry.delete``): tombstone; free the log and the index if the index is empty;
* ``release.lua`` on its parent, when the session is gone for good: unpin it; if the parent is a
  tombstone with no descendant left, free its log too and go on to *its* parent.

A fork pins its child under the parent before (cluster: ``pin.lua``) or while (one server:
``create.lua``) creating it, refusing when the parent is deleted, so a fork racing a deletion
either gets its whole seed or fails ``SESSION_NOT_FOUND``. A process killed between two steps
leaves a log pinned longer than needed (memory, never data).

Retention: ``sweep`` deletes disposed sessions older than a cut-off, oldest first, from the
retention index (``keys.DISPOSED_INDEX``); it never deletes a live session. Several sweepers may
run at once: every step is idempotent.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..core import errors, keys, rules, wire
from .registry import LIVE, UNPERSISTED, Registry


class Swept(msgspec.Struct, frozen=True, rename="camel"):
    """A session the sweep removed (or, in a dry run, would remove) and the bytes that frees."""

    id: str
    disposed_at: int
    bytes: int
    log_kept: bool  # descendants still read its log: freed with the last of them


def sweep(registry: Registry, *, now_ms: int, older_than_ms: int, limit: int = 1000, dry_run: bool = False,
          persisted_first: bool = False) -> list[Swept]:
    """Delete up to ``limit`` sessions disposed before ``now_ms - older_than_ms``, oldest first.

    Returns what was deleted (dry run: what would be, nothing changed), with the bytes freed
    (``MEMORY USAGE`` of the record, and of the log and index unless descendants pin them, less
    the tombstone's ~100 bytes). A session the persistence backend has not written whole yet is
    left for a later pass (``persisted_first``); a live one is never deleted.
    """
    due: list[Any] = registry.redis.zrangebyscore(keys.DISPOSED_INDEX, "-inf", now_ms - older_than_ms,
                                               start=0, num=limit, withscores=True)
    if not due:
        return []
    ids = [(wire.text(member), int(score)) for member, score in due]
    pipe = registry.redis.pipeline(transaction=False)
    for sid, _ in ids:
        for key in (keys.session(sid), keys.session_log(sid), keys.session_turns(sid), keys.session_children(sid)):
            pipe.memory_usage(key, samples=0)
        pipe.scard(keys.session_children(sid))
    sizes = pipe.execute()
    out: list[Swept] = []
    gone: list[str] = []
    for i, (sid, disposed_at) in enumerate(ids):
        record, log, turns, index, pins = (int(v or 0) for v in sizes[5 * i:5 * i + 5])
        freed = max(0, record - _TOMBSTONE_BYTES) + (0 if pins else log + turns + index)
        if not rules.is_valid_id(sid):
            gone.append(sid)
            continue
        if not dry_run:
            try:
                status = registry.delete(sid, only_disposed=True, persisted_first=persisted_first)
            except errors.ForkError:
                gone.append(sid)  # deleted already (another sweeper, or by hand)
                continue
            if status == UNPERSISTED:
                continue
            if status == LIVE:
                gone.append(sid)  # never happens to a disposed id; not ours to delete anyway
                continue
        out.append(Swept(sid, disposed_at, freed, bool(pins)))
    if gone and not dry_run:
        registry.redis.zrem(keys.DISPOSED_INDEX, *gone)
    return out


_TOMBSTONE_BYTES = 100
