"""What the source step of a fork finds: a snapshot (as references), or why it cannot fork."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import msgspec

from ..core import errors, rules, wire
from .wire import Header, SeedMeta

_segments = msgspec.json.Decoder(list[tuple[str, int, int]])


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The source step's result: the source's log at one instant, as references.

    ``length`` events: ``segments`` (inherited, ``seed_length`` of them) then the source's own
    events ``[0, length - seed_length)``.
    """

    source: Header
    length: int
    seed_length: int
    segments: tuple[tuple[str, int, int], ...]

    @property
    def meta(self) -> SeedMeta:
        return SeedMeta(parent_session=self.source.id, seed_length=self.length, cwd=self.source.cwd)

    def child_segments(self) -> list[list[object]]:
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


def prefix(segments: Segments, n: int) -> list[tuple[str, int, int]]:
    """The slices that hold the first ``n`` events of (resolved) ``segments``."""
    out = []
    for owner, lo, hi in segments:
        if n <= 0:
            break
        out.append((owner, lo, min(hi, lo + n)))
        n -= hi - lo
    return out


def parse_snapshot(sid: str, reply: list[Any]) -> Snapshot:
    status = wire.text(reply[0])
    if status == "NOT_FOUND":
        raise errors.not_found(sid)
    if status == "NOT_LIVE":
        raise errors.not_live(sid)
    if status == "OPEN_TURN":
        raise errors.open_turn(sid, wire.text(reply[1]))
    _, length, header, seed, seed_length = reply
    return Snapshot(wire.decode_header(header), int(length), int(seed_length),
                    decode_segments(seed))
