"""Reading a session's log across its lineage: ``LogReader``, the registry's read path.

Seeds are kept by reference: a forked child's record references its parent's seed and a slice
of its parent's own log (immutable, since logs are append-only), so a fork costs the same whatever
the parent's length and lineage depth, and a child uses memory only for its own events. Reading
resolves the reference from the parent's record (at most one record: a forked session stores its
seed by value), then reads every slice in one pipelined round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core import errors, keys, records, rules, wire
from .snapshots import SUMMARY_MARK, Segments, decode_segments, window
from .state import Lineage, RegistryState
from .wire import Event, Header

LINEAGE_CACHE = 4096  # sessions whose seed references a registry remembers (they never change)


@dataclass(frozen=True, slots=True)
class _Record:
    header: Header
    length: int
    seed_length: int
    segments: tuple[tuple[str, int, int], ...]


class LogReader:
    """A registry's read path (a part of ``registry.Registry``): a session's events, seed
    included, and the resolution of seed references, with the state's lineage cache."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state
        self.redis = state.redis

    def events(self, session_id: str, start: int = 0, stop: int | None = None) -> list[Event]:
        """``Registry.events``."""
        sid = rules.check_id(session_id)
        known = self.state.lineages.get(sid)
        if known is None:
            record = self._record(sid)
            known = self._remember(sid, record.seed_length, self.resolve(sid, record.segments))
        return self.read(sid, known[1], known[0], max(start, 0), stop)

    def owners(self, session_id: str) -> list[tuple[str, int, int]]:
        """``Registry.owners``."""
        sid = rules.check_id(session_id)
        known = self.state.lineages.get(sid)
        if known is None:
            record = self._record(sid)
            known = self._remember(sid, record.seed_length, self.resolve(sid, record.segments))
        out: list[tuple[str, int, int]] = []
        seq = 0
        for owner, lo, hi in known[1]:
            name = owner[1:] if owner.startswith(SUMMARY_MARK) else owner
            if out and out[-1][0] == name and out[-1][2] == seq:
                out[-1] = (name, out[-1][1], seq + hi - lo)
            else:
                out.append((name, seq, seq + hi - lo))
            seq += hi - lo
        return out

    def _remember(self, sid: str, seed_length: int, segments: Segments) -> Lineage:
        lineages = self.state.lineages
        known = lineages[sid] = (seed_length, segments)
        if len(lineages) > LINEAGE_CACHE:
            lineages.popitem(last=False)
        return known

    def resolve(self, sid: str, segments: Segments) -> Segments:
        """``Registry.resolve``."""
        if all(lo >= 0 for _, lo, _ in segments):
            return segments
        out: list[tuple[str, int, int]] = []
        for owner, lo, hi in segments:
            if lo >= 0:
                out.append((owner, lo, hi))
                continue
            known = self.state.lineages.get(owner)
            if known is None:
                seed_length, seed, length = self.redis.hmget(keys.session(owner), ["seedlen", "seed", "len"])
                seed_length = seed_length if seed_length is not None else length  # absent: never appended
                if seed is None or seed_length is None:  # gone for good: only if ``sid`` was deleted
                    if self.redis.hexists(keys.session(sid), "header"):
                        raise RuntimeError(f"{sid!r} references the seed of {owner!r}, which is gone")
                    raise errors.not_found(sid)
                known = self._remember(owner, int(seed_length), self.resolve(owner, decode_segments(seed)))
            out.extend(window(known[1], -hi, -lo))
        return tuple(out)

    def _record(self, sid: str) -> _Record:
        header, length, seed_length, seed, cwd, parent = self.redis.hmget(
            keys.session(sid), ["header", "len", "seedlen", "seed", "cwd", "parent"]
        )
        seed_length = seed_length if seed_length is not None else length  # absent until the first append
        if header is None or length is None or seed_length is None or seed is None:
            raise errors.not_found(sid)
        return _Record(records.decode_header(sid, header, cwd, parent), int(length), int(seed_length),
                       decode_segments(seed))

    def read(self, sid: str, segments: Sequence[tuple[str, int, int]], seed_length: int,
             start: int, stop: int | None) -> list[Event]:
        """Events ``[start, stop)`` (``stop=None``: to the end of the own log) of ``sid``, whose seed
        is ``seed_length`` events in ``segments`` (resolved: ``resolve``); ``SESSION_NOT_FOUND``
        when it was deleted meanwhile, never a partial log."""
        # Walk the log's pieces (ancestor slices, then the own log) and fetch the overlap of each
        # with [start, stop) in one pipeline; ancestor slices are immutable, so no lock is needed.
        # ``stop=None`` reads the own log to its end, whatever its length now.
        plan: list[tuple[str, int, int, int]] = []  # (log owner, first index, last index, first seq)
        seq = 0
        for owner, lo, hi in segments:
            a, b = max(start, seq), seq + hi - lo if stop is None else min(stop, seq + hi - lo)
            if a < b:
                plan.append((owner, lo + a - seq, lo + b - seq - 1, a))
            seq += hi - lo
        first = max(start, seed_length)
        if stop is None or first < stop:
            plan.append((sid, first - seed_length, -1 if stop is None else stop - seed_length - 1, first))
        pipe = self.redis.pipeline(transaction=False)
        for owner, first, last, _ in plan:
            if owner.startswith(SUMMARY_MARK):  # a summary child's seq 0, kept in its record
                pipe.hget(keys.session(owner[1:]), "summary")
            else:
                pipe.lrange(keys.session_log(owner), first, last)
        # Last, in the same round trip: still there? (deleted: SESSION_NOT_FOUND, never a partial log)
        pipe.hexists(keys.session(sid), "header")
        *results, there = pipe.execute()
        pieces: list[tuple[int, list[bytes]]] = []
        short = False
        for (owner, first, last, first_seq), got in zip(plan, results, strict=True):
            raws = got if isinstance(got, list) else [] if got is None else [got]
            # A log is freed (dropped, or a prefix of it made empty placeholders: a slice holds one
            # only if its first entry is one) only once its session is deleted, and an ancestor's
            # only as far as no descendant reads it. So a short ancestor slice, or a placeholder
            # anywhere (the own log too: a cluster pipeline sends a command again after a MOVED or
            # ASK, behind the check below), means this session was deleted meanwhile: checked
            # before any event is decoded, a placeholder never reaches the decoder.
            short = short or raws[:1] == [b""] or (owner != sid and len(raws) != last - first + 1)
            pieces.append((first_seq, raws))
        if short and there:
            there = bool(self.redis.hexists(keys.session(sid), "header"))
            if there:
                raise RuntimeError(f"an ancestor log of {sid!r} is shorter than, or freed within, what its seed "
                                   "references")
        if not there:
            self.state.lineages.pop(sid, None)
            raise errors.not_found(sid)
        return [wire.decode_stored_event(raw, first_seq + i) for first_seq, raws in pieces
                for i, raw in enumerate(raws)]
