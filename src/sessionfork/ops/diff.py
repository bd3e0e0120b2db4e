"""Branch diff: where two sessions share their history, and what each has after it.

A session's log is a list of *pieces* (its record's seed references ``[ancestor, start, stop)``,
then its own log), and logs are append-only, so two sessions hold the same event at a seq exactly
when the same piece of the same log is there. The shared prefix is found by walking the pieces,
without reading one event; only the divergent tails are read (through the seed references, as
``Registry.events`` does), so the cost of a diff follows the tails, not the shared history.

The fork point is taken from the sessions' seed references, never from an ancestor's length: a
child forked at an earlier seq than its parent's length (a boundary fork) is placed right. Each
side shows its state (``Registry.state_of``: live, merged, abandoned or disposed, with its merge),
read with its pieces.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from ..core import errors, keys, records, rules, wire
from ..core.registry import Registry
from ..core.snapshots import decode_segments, window
from ..core.wire import MergedInto, SessionState, SessionStateName
from .lineage import describe

Piece = tuple[str, int, int]  # (log owner, first list index, end list index)


class Side(msgspec.Struct, rename="camel", kw_only=True):
    """One side of a diff: its length, the seq where it left the common ancestor, its tail."""

    id: str
    length: int
    left_at: int
    """Events it shares with the common ancestor: the ancestor's seq where it branched off (the
    ancestor's own side: the events it shares with the other side)."""
    events: list[dict[str, Any]]
    """Its events with ``seq >= shared``, in the harness's JSON shape."""
    state: SessionStateName
    """``live``, ``merged``, ``abandoned`` or ``disposed`` (``Registry.state_of``)."""
    merged_into: MergedInto | msgspec.UnsetType = UNSET
    """Its latest merge into an ancestor (absent: never merged)."""
    abandoned_by: str | msgspec.UnsetType = UNSET
    """The select request that abandoned it (absent: not abandoned)."""


class Kept(msgspec.Struct, rename="camel", kw_only=True):
    """A summary child's kept range, mapped: its seqs ``1 .. count`` are the other side's seqs
    ``from_seq .. from_seq + count - 1`` (the same events, found from the seed references)."""

    session: str
    """The summary child (``a`` or ``b``): seq 0 its summary, seq ``s >= 1`` the other's ``s - 1 + fromSeq``."""
    from_seq: int
    count: int


class Diff(msgspec.Struct, rename="camel", kw_only=True):
    """``sessionfork diff A B --json``. ``ancestor`` is absent when the sessions are unrelated.

    A summary child numbers its kept events from 1, so against its parent it shares no prefix
    (``shared`` 0: both sides listed whole); ``kept`` then maps the range the two hold in common."""

    shared: int
    """Length of the common prefix (seq 0 .. shared-1): summarised, never listed."""
    a: Side
    """Session ``a``: its id, length, the seq where it left the ancestor, its events after the
    shared prefix."""
    b: Side
    """Session ``b``, as ``a``."""
    ancestor: str | None = None
    """The nearest common ancestor (possibly deleted); ``None`` when the two are unrelated."""
    kept: Kept | msgspec.UnsetType = UNSET
    """A summary child against its source: the range of events the two hold in common (absent
    otherwise)."""


def shared_length(a: Sequence[Piece], b: Sequence[Piece]) -> int:
    """How many leading events two piece lists have in common (same log, same index)."""
    i = j = pos = 0
    off_a = off_b = 0
    while i < len(a) and j < len(b):
        owner_a, lo_a, hi_a = a[i]
        owner_b, lo_b, hi_b = b[j]
        if owner_a != owner_b or lo_a + off_a != lo_b + off_b:
            break
        step = min(hi_a - lo_a - off_a, hi_b - lo_b - off_b)
        pos, off_a, off_b = pos + step, off_a + step, off_b + step
        if lo_a + off_a == hi_a:
            i, off_a = i + 1, 0
        if lo_b + off_b == hi_b:
            j, off_b = j + 1, 0
    return pos


def _pieces(registry: Registry, sid: str, *, deleted_ok: bool = False) -> tuple[int, list[Piece], SessionState | None]:
    """``(length, pieces, state)`` of a session, from its record (one read, no event read).

    With ``deleted_ok``, a deleted ancestor's tombstone does too while descendants pin it (it
    keeps its seed, and its log): its pieces are its seed and its whole own log."""
    length, seed_length, seed, header, *fields = registry.redis.hmget(
        keys.session(sid), ["len", "seedlen", "seed", "header", *records.STATE_FIELDS])
    deleted = fields[1]
    state = records.decode_state(sid, header, *fields)
    if deleted is not None and deleted_ok and seed is not None and seed_length is not None:
        length = str(int(seed_length) + int(registry.redis.llen(keys.session_log(sid))))
    seed_length = seed_length if seed_length is not None else length  # absent until the first append
    if length is None or seed_length is None or seed is None or (deleted is not None and not deleted_ok):
        raise errors.not_found(sid)
    total, own = int(length), int(length) - int(seed_length)
    # A child's seed may reference its parent's seed: resolved into ancestor slices (cached).
    pieces = [p for p in registry.resolve(sid, decode_segments(seed)) if p[2] > p[1]]
    return total, [*pieces, (sid, 0, own)] if own else pieces, state


def _chain(registry: Registry, sid: str) -> list[str]:
    """``sid`` and its ancestors, nearest first: from the headers' ``parentSession``, and through a
    deleted ancestor from its tombstone's ``parent`` (kept while descendants pin it)."""
    chain = [sid]
    parent = registry.header(sid).parent_session
    while parent is not UNSET and parent not in chain:
        chain.append(parent)
        header, parent_field = registry.redis.hmget(keys.session(parent), ["header", "parent"])
        found = records.parent_of(header, parent_field)
        if found is None:
            break  # a root, or a deleted ancestor with no parent: the chain ends with it
        parent = found
    return chain


def diff(registry: Registry, a: str, b: str) -> Diff:
    """The diff of sessions ``a`` and ``b`` (``SESSION_NOT_FOUND`` for one never created).

    The common ancestor may be deleted (its descendants keep its log): it is named all the same.
    Unrelated sessions (``ancestor`` absent) read no event: ``shared`` is 0 and both sides list
    none, whatever their length."""
    a, b = rules.check_id(a), rules.check_id(b)
    (len_a, pieces_a, state_a), (len_b, pieces_b, state_b) = _pieces(registry, a), _pieces(registry, b)
    shared = shared_length(pieces_a, pieces_b)
    chain_b = set(_chain(registry, b))
    ancestor = next((sid for sid in _chain(registry, a) if sid in chain_b), None)
    if ancestor is None:
        return Diff(shared=0, a=_side(registry, a, len_a, 0, len_a, state_a),
                    b=_side(registry, b, len_b, 0, len_b, state_b))
    try:
        _, pieces_n, _ = _pieces(registry, ancestor, deleted_ok=True)
        left_a, left_b = shared_length(pieces_a, pieces_n), shared_length(pieces_b, pieces_n)
    except errors.ForkError:  # an ancestor gone for good (only after a data loss): they left at the split
        left_a = left_b = shared
    return Diff(shared=shared, ancestor=ancestor, a=_side(registry, a, len_a, left_a, shared, state_a),
                b=_side(registry, b, len_b, left_b, shared, state_b),
                kept=_kept(registry, a, pieces_a, pieces_b, len_b) or _kept(registry, b, pieces_b, pieces_a, len_a)
                or UNSET)


def _kept(registry: Registry, sid: str, mine: list[Piece], other: list[Piece], other_length: int) -> Kept | None:
    """The kept range of ``sid`` (a summary child) in the other side, when they share it: its
    seqs from 1 against the other's from ``keptFrom`` (no event read: same log, same index)."""
    keep_from = registry.header(sid).kept_from
    if keep_from is UNSET or not mine or keep_from > other_length:
        return None
    count = shared_length(mine[1:], window(tuple(other), keep_from, other_length))
    return Kept(session=sid, from_seq=keep_from, count=count) if count else None


def _side(registry: Registry, sid: str, length: int, left_at: int, shared: int, state: SessionState | None) -> Side:
    tail = registry.events(sid, shared, length) if length > shared else []
    if state is None:  # _pieces raised for a session that is not there
        raise errors.not_found(sid)
    return Side(id=sid, length=length, left_at=left_at, events=[wire.event_to_builtins(e) for e in tail],
                state=state.state, merged_into=state.merged_into, abandoned_by=state.abandoned_by)


def render_text(found: Diff, width: int = 160) -> str:
    """Readable diff: the shared prefix summarised, then each side's events after it; a side that
    is the common ancestor itself (a session against its descendant, or against itself) is named
    so, not as having left itself."""
    lines = [f"common ancestor: {found.ancestor}"]
    lines.append(f"shared prefix: {found.shared} event(s)" + (f" (seq 0-{found.shared - 1}), not shown"
                                                           if found.shared else ""))
    if not isinstance(found.kept, msgspec.UnsetType):
        k = found.kept
        lines.append(f"summary child {k.session}: its seq 1-{k.count} are the other's seq "
                     f"{k.from_seq}-{k.from_seq + k.count - 1} (its seq 0 summarises 0-{k.from_seq - 1})")
    for label, side in (("A", found.a), ("B", found.b)):
        lines.append("")
        state = describe(side.state, side.merged_into, side.abandoned_by)
        where = "the common ancestor" if side.id == found.ancestor else \
            f"left {found.ancestor} at seq {side.left_at}"
        lines.append(f"{label} {side.id} ({state}): {where}; "
                     f"length {side.length}; {len(side.events)} event(s) after the shared prefix")
        for event in side.events:
            rest = {k: v for k, v in event.items() if k not in ("type", "seq", "time")}
            body = json.dumps(rest, ensure_ascii=False, separators=(",", ":"))
            line = f"  {event['seq']:>6}  {event['type']}  {body}"
            lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return "\n".join(lines)
