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
* ``release.lua`` on the session itself right after ``delete.lua`` when it is pinned, and on a
  deleted parent whenever a child goes or reads less of it: free the own-log prefix no descendant
  reads (a summary child reads its parent from its ``keepFrom``: ``keys.session_needs``; positions
  stay, as placeholders), then unpin it from its parent, or raise its need there, when its
  descendants read none, or less, of its seed (docs/storage.md).

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
    the tombstone's ~100 bytes; not a dry run: plus what the deletion freed of a pinned log that
    its descendants read only part of, as summary children do, measured after it). A live
    session is never deleted. With ``persisted_first``, a session the persistence backend has
    not written whole yet is left for a later pass and
    **passed over**: the sweep goes on to the sessions disposed after it (no head-of-line
    blocking), examining at most ``SCAN_PAGES`` pages of ``limit`` index entries per call; the
    backend is asked for a flush of each at most once a minute (``Registry.ask_flush``).
    """
    cutoff = now_ms - older_than_ms
    out: list[Swept] = []
    offset = 0
    for _ in range(SCAN_PAGES):
        due: list[Any] = registry.redis.zrangebyscore(keys.DISPOSED_INDEX, "-inf", cutoff,
                                                      start=offset, num=limit, withscores=True)
        if not due:
            break
        ids = [(wire.text(member), int(score)) for member, score in due]
        waiting = set() if dry_run or not persisted_first else _waiting(registry, [sid for sid, _ in ids])
        todo = [(sid, at) for sid, at in ids if sid not in waiting][:limit - len(out)]
        done, gone = _delete(registry, todo, dry_run=dry_run, persisted_first=persisted_first)
        out += done
        if gone and not dry_run:
            registry.redis.zrem(keys.DISPOSED_INDEX, *gone)
        if len(out) >= limit or len(due) < limit:
            break
        # Entries of this page still in the index (waiting for the backend): the next page starts
        # after them. Another sweeper's deletions may shift it: what it skips, the next pass sees.
        offset += len(due) if dry_run else len(due) - len(done) - len(gone)
    return out


SCAN_PAGES = 20
"""Pages of ``limit`` index entries one ``sweep`` examines at most (sessions waiting for the
persistence backend are passed over, not deleted, so they need not stop the sweep)."""


def _waiting(registry: Registry, ids: list[str]) -> set[str]:
    """Those of ``ids`` whose log the persistence backend does not hold whole yet (a flush is
    asked for each, at most once a minute): one pipelined read, no script."""
    valid = [sid for sid in ids if rules.is_valid_id(sid)]
    pipe = registry.redis.pipeline(transaction=False)
    for sid in valid:
        pipe.hget(keys.session(sid), "len")
        pipe.get(keys.session_persisted(sid))
    found = pipe.execute()
    waiting: dict[str, int] = {}
    for i, sid in enumerate(valid):
        length, persisted = found[2 * i], found[2 * i + 1]
        if length is not None and int(persisted or -1) < int(length):
            waiting[sid] = int(length)
    registry.ask_flush(list(waiting.items()))
    return set(waiting)


def _delete(registry: Registry, ids: list[tuple[str, int]], *, dry_run: bool,
            persisted_first: bool) -> tuple[list[Swept], list[str]]:
    """Delete ``ids`` (with their disposal times): what was deleted, and the ids to drop from the
    index (deleted already, or not valid ids)."""
    if not ids:
        return [], []
    pipe = registry.redis.pipeline(transaction=False)
    for sid, _ in ids:
        for key in (keys.session(sid), keys.session_log(sid), keys.session_turns(sid), keys.session_children(sid)):
            pipe.memory_usage(key, samples=0)
        pipe.scard(keys.session_children(sid))
    sizes = pipe.execute()
    out: list[Swept] = []
    gone: list[str] = []
    held: dict[str, int] = {}  # bytes of the log and turn index before
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
                continue  # written since the look above; its flush was asked: a later pass
            if status == LIVE:
                gone.append(sid)  # never happens to a disposed id; not ours to delete anyway
                continue
        out.append(Swept(sid, disposed_at, freed, bool(pins)))
        held[sid] = log + turns
    return (out if dry_run else _partly_freed(registry, out, held)), gone


def _partly_freed(registry: Registry, swept: list[Swept], held: dict[str, int]) -> list[Swept]:
    """``swept`` with what deleting each pinned one freed of its log and turn index (``held``
    bytes before; its descendants read only part of it: docs/storage.md) added to its bytes."""
    kept = [s.id for s in swept if s.log_kept]
    if not kept:
        return swept
    pipe = registry.redis.pipeline(transaction=False)
    for sid in kept:
        pipe.memory_usage(keys.session_log(sid), samples=0)
        pipe.memory_usage(keys.session_turns(sid), samples=0)
    now = [int(v or 0) for v in pipe.execute()]
    more = {sid: max(0, held[sid] - now[2 * i] - now[2 * i + 1]) for i, sid in enumerate(kept)}
    return [msgspec.structs.replace(s, bytes=s.bytes + more.get(s.id, 0)) for s in swept]


_TOMBSTONE_BYTES = 100
