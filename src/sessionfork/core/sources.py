"""The source step of a fork: ``SnapshottingStore``, the registry's base (``registry`` adds the child step).

The source step is one script on the source's slot (live? instance? boundary? length?:
``prepare_fork``); it touches no other session, so it runs unchanged on a Redis Cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from redis.commands.core import Script

from ..core import errors, keys, lua, records, rules, wire
from .deletion import DeletingStore
from .snapshots import SUMMARY_MARK, ForkPlan, Snapshot, parse_snapshot
from .store import SessionRef, split_ref
from .wire import Event, Header


class SnapshottingStore(DeletingStore):
    """``DeletingStore`` plus the source step of a fork (``prepare_fork``, ``take_snapshot``) and
    the reads of its result (``turn_at``, ``read_snapshot``); see ``Registry``."""

    def take_snapshot(self, source: SessionRef, boundary: int | None = None, *,
                      if_length: int | None = None, keep_from: int | None = None) -> Snapshot:
        """The source step alone: ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE``, ``PRECONDITION_FAILED``
        (with ``if_length``), then ``INVALID_BOUNDARY`` (with ``boundary``) or ``OPEN_TURN`` (without)."""
        plan = self.prepare_fork(source, boundary=boundary, if_length=if_length, keep_from=keep_from)
        if plan.error is not None:
            raise plan.error
        assert plan.snapshot is not None
        return plan.snapshot

    def prepare_fork(self, source: SessionRef, child_ids: Sequence[str] = (), *,
                     request_id: str = "", boundary: int | None = None,
                     if_length: int | None = None, keep_from: int | None = None) -> ForkPlan:
        """The source step, plus a look at the children-to-be, in one round trip.

        The source step is one script on the source's slot: live? instance? boundary? length?
        Each child id that exists lands in ``existing``, or in ``replayed`` when ``request_id``
        created it (a replay after a crash). With ``if_length``, a source whose log does not have
        exactly that many events is ``PRECONDITION_FAILED``, checked in the same script, right after
        live/instance and before the boundary. Ids are checked here, before any Redis call. A
        ``boundary`` inside the source's inherited seed is checked by one more read on the ancestor
        that holds that event (its events up to there never change, so the check needs no
        atomicity with the source step). ``keep_from`` (a summary's): its ``keepFrom - 1`` is checked
        between turns in the same script when it falls in the source's own events (one round trip
        saved), ``INVALID_BOUNDARY`` otherwise; elsewhere ``create_children`` checks it.
        """
        sid, instance = split_ref(source)
        child_ids = [rules.check_id(c) for c in child_ids]
        ops = self.look_ops(sid, instance, child_ids, boundary, if_length, keep_from)
        if not self._cluster:
            return self.plan_of(sid, child_ids, request_id, boundary, lua.run(self.redis, ops), if_length, keep_from)
        # A cluster pipeline cannot carry scripts, and the children live on several nodes.
        pipe = self.redis.pipeline(transaction=False)
        for op in ops[:-1]:
            pipe.execute_command(*op)
        taken = pipe.execute() if child_ids else []
        return self.plan_of(sid, child_ids, request_id, boundary, [*taken, self._call(ops[-1])], if_length,
                            keep_from)

    def _call(self, op: lua.Op) -> Any:
        """One script call: pipelined on a server; on a cluster through the cluster client, which
        follows a failover's new topology itself."""
        if not self._cluster:
            return lua.run(self.redis, [op])[0]
        script, script_keys, args = op
        assert isinstance(script, Script)
        return script(keys=list(script_keys), args=list(args))

    def look_ops(self, sid: str, instance: str, child_ids: Sequence[str],
                 boundary: int | None = None, if_length: int | None = None,
                 keep_from: int | None = None) -> list[lua.Op]:
        """The read-only commands of ``prepare_fork`` (the source step last), for ``lua.run``."""
        ops: list[lua.Op] = [("HMGET", keys.session(child), "req", *records.HEADER_FIELDS) for child in child_ids]
        ops.append(self._scripts.op("snapshot", record=keys.session(sid), turns=keys.session_turns(sid),
                                    log=keys.session_log(sid), instance=instance,
                                    boundary="" if boundary is None else boundary,
                                    if_length="" if if_length is None else if_length,
                                    keep="" if keep_from is None else keep_from - 1, session_id=sid))
        return ops

    def _check_seed(self, sid: str, snap: Snapshot, boundary: int) -> Snapshot:
        """Finish the boundary rule for a boundary the source step could not check itself: one
        inside the source's inherited seed (checked on the ancestor that holds it), or on a record
        written before turn indexes (checked by reading the prefix)."""
        seed_end, last = self.turn_at(sid, snap, boundary,
                                      lambda start: errors.boundary_inside_turn(sid, boundary, start))
        return dataclasses.replace(snap, seed_end=seed_end, last_type=last)

    def turn_at(self, sid: str, snap: Snapshot, seq: int,
                inside: Callable[[int], errors.ForkError]) -> tuple[int | None, str]:
        """Where event ``seq < snap.length`` of ``snap``'s source stands: the seq of the newest
        ``turn/end`` at or before it (-1: none) and its type; raises ``inside(seq of the turn/start)``
        when it is inside a turn. One read on the log that holds it (events up to ``seq`` never
        change: no atomicity with the source step needed), mapped to ``sid``'s numbering (a summary
        child numbers the kept events of its source from 1)."""
        segments = self.resolve(sid, snap.segments)  # a reference names the parent, not the owner
        if seq >= snap.seed_length:
            owner, index, summary_first = sid, seq - snap.seed_length, False
        else:
            owner, index = rules.owner_of(segments, seq)
            summary_first = str(segments[0][0]).startswith(SUMMARY_MARK)
        if owner.startswith(SUMMARY_MARK):
            return -1, rules.SUMMARY  # seq 0 of a summary child: before any turn
        reply = self._call(self._scripts.op("turn", record=keys.session(owner), turns=keys.session_turns(owner),
                                            log=keys.session_log(owner), index=index))
        status = wire.text(reply[0])
        if status != "NOINDEX":
            shift = int(reply[-1]) + index - seq  # owner's seq = sid's seq + shift
            if status == "INSIDE":
                raise inside(int(reply[1]) - shift)
            end = int(reply[1]) - shift
            return (end if int(reply[1]) >= 0 and end >= int(summary_first) else -1), wire.text(reply[2])
        types = [e.type for e in self._read(sid, segments, snap.seed_length, 0, seq + 1)]
        error = rules.check_boundary_in(sid, types, seq)
        if error is not None:
            starts = [i for i, kind in enumerate(types) if kind == rules.TURN_START]
            raise inside(starts[-1]) if starts else error
        ends = [i for i, kind in enumerate(types) if kind == rules.TURN_END]
        return ends[-1] if ends else -1, types[-1]

    def plan_of(self, sid: str, child_ids: Sequence[str], request_id: str, boundary: int | None,
                results: Sequence[Any], if_length: int | None = None, keep_from: int | None = None) -> ForkPlan:
        """The ``ForkPlan`` that the results of ``look_ops`` describe."""
        *taken, reply = results
        existing: list[str] = []
        replayed: dict[str, Header] = {}
        for child, (req, header, cwd, parent) in zip(child_ids, taken, strict=True):
            if header is None:
                continue
            if request_id and req is not None and wire.text(req) == request_id:
                replayed[child] = records.decode_header(child, header, cwd, parent)
            else:
                existing.append(child)
        try:
            snap, unchecked = parse_snapshot(sid, reply, boundary, if_length, keep_from)
            if unchecked and boundary is not None:
                snap = self._check_seed(sid, snap, boundary)
            return ForkPlan(snap, None, existing, replayed)
        except errors.ForkError as exc:
            return ForkPlan(None, exc, existing, replayed)

    def read_snapshot(self, snap: Snapshot) -> list[Event]:
        """The events a snapshot covers: fresh objects, safe for the caller to mutate."""
        return self._read(snap.source.id, self.resolve(snap.source.id, snap.segments), snap.seed_length, 0,
                          snap.length)
