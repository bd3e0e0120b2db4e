"""What the source step of a fork finds: a snapshot (as references), or why it cannot fork."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgspec

from ..core import errors, rules, wire
from .wire import Header, SeedMeta

_segments = msgspec.json.Decoder(list[tuple[str, int, int]])


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The source step's result: a prefix of the source's log, as references.

    ``length`` events (the whole log at one instant, or ``boundary + 1``): the first of the
    source's inherited ``segments`` (``seed_length`` events), then its own events
    ``[0, length - seed_length)`` when ``length > seed_length``. ``seed_end`` is the seq of the
    newest ``turn/end`` among them (-1: none; ``None``: unknown, a source without a turn index),
    ``last_type`` the type of the last of them (``None``: a snapshot stored before boundaries,
    whose last event is a ``turn/end`` unless it is empty).
    """

    source: Header
    """The source's header."""
    length: int
    """The number of events in the snapshot (a child's ``seedLength``)."""
    seed_length: int
    """The source's own seed length: how many of them are inherited ``segments``."""
    segments: tuple[tuple[str, int, int], ...]
    """The inherited seed, as references ``(log owner, first index, end index)``."""
    seed_end: int | None = None
    """The seq of the newest ``turn/end`` in the snapshot (-1: none; ``None``: unknown)."""
    last_type: str | None = None
    """The type of its last event (``None``: a snapshot stored before boundaries)."""
    between_turns: int | None = None
    """A seq the source step found between turns (a summary's ``keepFrom - 1``): not checked again."""

    @property
    def last(self) -> str:
        """The type of the seed's last event ("" for an empty seed)."""
        if self.last_type is not None:
            return self.last_type
        return rules.TURN_END if self.length else ""

    @property
    def meta(self) -> SeedMeta:
        """The lineage a child of this snapshot records: its parent, seed length and ``cwd``."""
        return SeedMeta(parent_session=self.source.id, seed_length=self.length, cwd=self.source.cwd)

    def child_segments(self) -> list[list[object]]:
        """A child's seed references to this snapshot (``rules.child_segments``): one level deep."""
        return rules.child_segments(
            self.source.id, [list(s) for s in self.segments], self.seed_length, self.length
        )


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """What the source step found: a snapshot or the error that stops the fork, and the
    children that the same request id already created (a replay after a crash)."""

    snapshot: Snapshot | None
    error: errors.ForkError | None
    existing: list[str]
    replayed: dict[str, Header]


Segments: TypeAlias = "tuple[tuple[str, int, int], ...]"


def decode_segments(raw: bytes | str) -> Segments:
    """The ``seed`` field of a session record."""
    return tuple(_segments.decode(raw))


SUMMARY_MARK = "@"
"""A slice ``["@<id>", 0, 1]``: the summary event of summary child ``<id>`` (its seq 0), stored in
its record (field ``summary``; ``@`` is never in a session id)."""


def window(segments: Segments, a: int, b: int) -> list[tuple[str, int, int]]:
    """The slices that hold events ``[a, b)`` of (resolved) ``segments``."""
    out = []
    start = 0
    for owner, lo, hi in segments:
        end = start + hi - lo
        x, y = max(a, start), min(b, end)
        if x < y:
            out.append((owner, lo + x - start, lo + y - start))
        start = end
        if start >= b:
            break
    return out


def parse_snapshot(sid: str, reply: list[Any], boundary: int | None = None,
                   if_length: int | None = None, keep_from: int | None = None) -> tuple[Snapshot, bool]:
    """The snapshot.lua reply as a snapshot, and whether its boundary still needs checking
    against the ancestor that holds it (``SEED``); raises the source step's errors."""
    status = wire.text(reply[0])
    if status == "NOT_FOUND":
        raise errors.not_found(sid)
    if status == "NOT_LIVE":
        raise errors.not_live(sid)
    if status == "PRECONDITION":
        assert if_length is not None
        raise errors.precondition_failed(sid, int(reply[1]), if_length)
    if status == "OPEN_TURN":
        raise errors.open_turn(sid, wire.text(reply[1]))
    if status in ("RANGE", "INSIDE"):
        assert boundary is not None
        if status == "INSIDE":
            raise errors.boundary_inside_turn(sid, boundary, int(reply[1]))
        error = rules.boundary_error(sid, boundary, int(reply[1]), None)
        assert error is not None
        raise error
    if status == "KEEP_INSIDE":
        assert keep_from is not None
        raise errors.invalid_keep_from(sid, keep_from, f"event {keep_from - 1} is inside the turn opened at seq "
                                                       f"{int(reply[1])}")
    _, length, header, seed, seed_length, seed_end, last, *checked = reply
    end = None if seed_end in (b"", "") else int(seed_end)
    snap = Snapshot(wire.decode_header(header), int(length), int(seed_length), decode_segments(seed), end,
                    wire.text(last), keep_from - 1 if checked and keep_from is not None else None)
    return snap, status == "SEED"


@dataclass(frozen=True, slots=True)
class ChildSeed:
    """What a child of a snapshot starts with: ``length`` events stored as ``segments`` (by
    reference), the seq of their newest ``turn/end`` (-1 none, ``None`` unknown) and the type of
    the last; for a summary child, ``kept_from`` and its ``session/summary`` event's stored JSON."""

    length: int
    segments: list[list[object]]
    seed_end: int | None
    last_type: str
    kept_from: int | None = None
    summary: bytes | None = None


def plain_seed(snap: Snapshot) -> ChildSeed:
    """The seed of a plain or boundary child: the snapshot's events, by reference."""
    return ChildSeed(snap.length, rules.by_reference(snap.source.id, snap.child_segments()), snap.seed_end,
                     snap.last)


def summary_seed(snap: Snapshot, child_id: str, keep_from: int, event: bytes) -> ChildSeed:
    """The seed of a summary child of ``snap`` (``keep_from`` checked by the caller): its summary
    event (``event``, kept in its record: the slice ``[@child, 0, 1]``), then the source's events
    ``[keep_from, snap.length)`` as at most two references: ``[source, -b, -a]`` (events ``[a, b)``
    of the source's seed) and a slice of the source's own log. O(1) in the source's length and
    lineage depth; seqs are positions, so the kept events read back renumbered from 1."""
    src, sl, end = snap.source.id, snap.seed_length, snap.length
    segments: list[list[object]] = [[SUMMARY_MARK + child_id, 0, 1]]
    if keep_from < min(sl, end):
        segments.append([src, -min(sl, end), -keep_from])
    if end > max(keep_from, sl):
        segments.append([src, max(keep_from, sl) - sl, end - sl])
    shift = keep_from - 1  # source seq = child seq + shift, for the kept events
    seed_end = None if snap.seed_end is None else (snap.seed_end - shift if snap.seed_end >= keep_from else -1)
    last = snap.last if end > keep_from else rules.SUMMARY
    return ChildSeed(1 + end - keep_from, segments, seed_end, last, keep_from, event)


def edit_fields(snap: ChildSeed, payload: list[bytes], types: Sequence[str]) -> dict[str, Any]:
    """The create script's arguments for a child of seed ``snap`` whose log goes on with edits of
    ``types`` stored as ``payload``: its length, last type, newest ``turn/end`` and turn-index
    entries follow them (no turn index for a seed without one: ``seed_end`` unknown)."""
    base = snap.length
    ends = [base + i for i, t in enumerate(types) if t == rules.TURN_END]
    known = snap.seed_end is not None
    last_end: int | str = "" if snap.seed_end is None else (ends[-1] if ends else snap.seed_end)
    markers = " ".join(str(2 * base + m) for m in rules.batch_markers(types)) if known else ""
    return {"length": base + len(types), "last_type": types[-1], "last_end": last_end, "markers": markers,
            "edits": payload}
