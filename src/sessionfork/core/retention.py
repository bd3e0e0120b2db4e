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

Branches that end: ``dispose_ended`` disposes the sessions that ended (merged into an ancestor, or
abandoned by a select: ``keys.ENDED_INDEX``) longer ago than the branch TTL, oldest first; disposed,
they enter the retention index, and ``sweep`` deletes them once the retention has passed since.
Disposal writes only the session's own record (its instance goes), never a byte of a descendant's
or an ancestor's log: a merge copied the merged events into the ancestor's own log, so nothing
there reads the merged child's log, and the child's descendants read it through the children
index's pin, which deletion keeps (above). ``run_pass`` is one maintenance pass: both, in order.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..core import errors, keys, records, rules, wire
from .registry import LIVE, UNPERSISTED, Registry

PASS_LIMIT = 1000
"""Most branches one maintenance pass disposes, and most sessions it deletes, per worker."""


class Ended(msgspec.Struct, frozen=True, rename="camel"):
    """A branch that ended, disposed by ``dispose_ended`` (or, in a dry run, that would be), and
    the bytes it holds that retention frees once it deletes it (as ``Swept.bytes`` counts them)."""

    id: str
    ended_at: int
    state: wire.SessionStateName  # "merged" or "abandoned"
    bytes: int
    log_kept: bool  # descendants read its log: retention frees it with the last of them


class Pass(msgspec.Struct, frozen=True):
    """One maintenance pass (``run_pass``): the branches it disposed, then the sessions it deleted."""

    ended: list[Ended]
    swept: list[Swept]


class Swept(msgspec.Struct, frozen=True, rename="camel"):
    """A session the sweep removed (or, in a dry run, would remove) and the bytes that frees."""

    id: str
    disposed_at: int
    bytes: int
    log_kept: bool  # descendants still read its log: freed with the last of them


def sweep(registry: Registry, *, now_ms: int, older_than_ms: int, limit: int = PASS_LIMIT, dry_run: bool = False,
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


def dispose_ended(registry: Registry, *, now_ms: int, older_than_ms: int, limit: int = PASS_LIMIT,
                  dry_run: bool = False) -> list[Ended]:
    """Dispose up to ``limit`` branches that ended (merged or abandoned) before ``now_ms -
    older_than_ms``, oldest first, from the ended index (``keys.ENDED_INDEX``); ``older_than_ms``
    <= 0 disposes none (``SESSIONFORK_BRANCH_TTL=0`` keeps them live).

    Returns those disposed (dry run: those that would be, nothing changed) with the bytes each
    holds. A session disposed or deleted meanwhile is only removed from the index; a session the
    index names that has not ended (never written so by sessionfork) is removed too, never
    disposed. Disposal is ``Registry.dispose``: the session enters the retention index.
    """
    if older_than_ms <= 0:
        return []
    due: list[Any] = registry.redis.zrangebyscore(keys.ENDED_INDEX, "-inf", now_ms - older_than_ms,
                                                  start=0, num=limit, withscores=True)
    ids = [(wire.text(member), int(score)) for member, score in due]
    valid = [(sid, at) for sid, at in ids if rules.is_valid_id(sid)]
    gone = [sid for sid, _ in ids if not rules.is_valid_id(sid)]
    pipe = registry.redis.pipeline(transaction=False)
    for sid, _ in valid:
        pipe.hmget(keys.session(sid), ["header", *records.STATE_FIELDS])
    states = [records.decode_state(sid, *fields) for (sid, _), fields in zip(valid, pipe.execute(), strict=True)]
    ending = [(sid, at, st.state) for (sid, at), st in zip(valid, states, strict=True)
              if st is not None and st.state in ENDED_STATES]
    gone += [sid for (sid, _), st in zip(valid, states, strict=True) if st is None or st.state not in ENDED_STATES]
    sizes = _sizes(registry, [sid for sid, _, _ in ending])
    out: list[Ended] = []
    for (sid, at, state), (freed, pinned, _) in zip(ending, sizes, strict=True):
        if not dry_run:
            gone.append(sid)  # out of the index either way
            try:
                registry.dispose(sid)
            except errors.ForkError:
                continue  # disposed or deleted meanwhile: nothing left to do
        out.append(Ended(sid, at, state, freed, pinned))
    if gone and not dry_run:
        registry.redis.zrem(keys.ENDED_INDEX, *gone)
    return out


ENDED_STATES = ("merged", "abandoned")
"""The states of a branch that ended (``wire.SessionState``)."""


def run_pass(registry: Registry, *, now_ms: int, retention_ms: int, branch_ttl_ms: int, limit: int = PASS_LIMIT,
             dry_run: bool = False, persisted_first: bool = False) -> Pass:
    """One maintenance pass: ``dispose_ended`` (branches that ended longer ago than
    ``branch_ttl_ms``; none when it is 0), then ``sweep`` (sessions disposed longer ago than
    ``retention_ms``; none when it is 0). A branch disposed by this pass is deleted by a later one,
    once the retention has passed since its disposal. Dry run: what a pass would do, nothing changed."""
    ended = dispose_ended(registry, now_ms=now_ms, older_than_ms=branch_ttl_ms, limit=limit, dry_run=dry_run)
    swept = (sweep(registry, now_ms=now_ms, older_than_ms=retention_ms, limit=limit, dry_run=dry_run,
                   persisted_first=persisted_first) if retention_ms > 0 else [])
    return Pass(ended, swept)


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
    out: list[Swept] = []
    gone: list[str] = []
    held: dict[str, int] = {}  # bytes of the log and turn index before
    for (sid, disposed_at), (freed, pins, log_bytes) in zip(ids, _sizes(registry, [sid for sid, _ in ids]),
                                                              strict=True):
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
        out.append(Swept(sid, disposed_at, freed, pins))
        held[sid] = log_bytes
    return (out if dry_run else _partly_freed(registry, out, held)), gone


def _sizes(registry: Registry, ids: list[str]) -> list[tuple[int, bool, int]]:
    """For each of ``ids``: ``(bytes its deletion frees, pinned by descendants, bytes of its log
    and turn index)``: ``MEMORY USAGE`` of the record, and of the log and indexes unless
    descendants pin them, less the tombstone's ~100 bytes. One pipelined read."""
    if not ids:
        return []
    pipe = registry.redis.pipeline(transaction=False)
    for sid in ids:
        for key in (keys.session(sid), keys.session_log(sid), keys.session_turns(sid), keys.session_children(sid)):
            pipe.memory_usage(key, samples=0)
        pipe.scard(keys.session_children(sid))
    sizes = pipe.execute()
    out = []
    for i in range(len(ids)):
        record, log, turns, index, pins = (int(v or 0) for v in sizes[5 * i:5 * i + 5])
        out.append((max(0, record - _TOMBSTONE_BYTES) + (0 if pins else log + turns + index), bool(pins), log + turns))
    return out


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
