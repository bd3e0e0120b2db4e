"""The steps of a merge and a select: ``MergeSteps``, the part of ``registry.Registry`` that
``merges`` composes them from.

A merge reads the lineage (the child's ``parentSession`` chain up to the parent: records that
never change, so the reads need no atomicity), then runs one script on the child's slot (which of
its events: ``merge_read.lua``, read-only), one on the parent's slot (the whole merge turn written
at once, or nothing: ``merge.lua``, which also keeps the merges index that makes a range merge
once and a request id merge once), then marks the child merged (``mark.lua``; a select also marks
its other candidates abandoned: on one server all in one ``mark_many.lua`` call). The parent's
step is the one effect: a worker that dies after it leaves a merge its retry recognises by request
id, and marks again (marks are idempotent). No
step touches two sessions' slots, so merges and selects run unchanged on a Redis Cluster, parent
and child in different slots. ``MergeSteps.run_many`` runs each step for many specs at once (a
worker's batch): one round trip per step, the parents' steps in the order given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..core import errors, keys, lua, records, rules, wire
from .specs import MergeSpec, SelectSpec
from .state import RegistryState
from .store import SessionStore, split_ref
from .wire import NewEvent

MAX_MERGE_EVENTS = 10_000
"""Most events one merge of mode ``events`` brings back (``INVALID_BOUNDARY`` beyond: merge the
range in parts)."""
MAX_MERGE_BYTES = 16 * 1024 * 1024
"""Most bytes of stored events one merge of mode ``events`` brings back (``INVALID_BOUNDARY``
beyond: merge the range in parts); the default of ``SESSIONFORK_MAX_REQUEST_WRITE_BYTES``."""
MAX_DEPTH = 100_000
"""Most ``parentSession`` links a lineage walk follows before it gives up (``NOT_DESCENDANT``)."""
_RECORD = ("header", "instance", "parent", "seedlen", "len", "mergedinto", "abandoned")
_merged_into = msgspec.json.Decoder(tuple[str, int, str])
_event_body = msgspec.json.Decoder(dict[str, Any])
_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Merged:
    """What a merge (or a select's merge) wrote: the parent's seqs ``first..length-1`` (the merge's
    turn/start to its turn/end), and the child's range ``from_seq..to_seq`` brought back."""

    parent: str
    """The session merged into."""
    child: str
    """The session merged from (a select's winner)."""
    first: int
    """The parent's seq of the merge's ``turn/start``."""
    length: int
    """The parent's length after the merge (its ``turn/end`` is ``length - 1``)."""
    from_seq: int
    """The first of the child's events merged."""
    to_seq: int
    """The last of the child's events merged."""
    abandoned: tuple[str, ...] = ()
    """A select's other candidates, abandoned (request order); ``()`` for a merge."""


@dataclass(frozen=True, slots=True)
class _Record:
    exists: bool
    instance: str | None
    parent: str | None
    seed_length: int
    length: int
    merged_into: tuple[str, int, str] | None
    abandoned: str | None
    planned: bool = False
    """This request planned a merge of it already (``plan_field``): a retry."""


class MergeSteps:
    """The merge's and select's steps on the state's connection; events encoded as ``store`` does."""

    def __init__(self, state: RegistryState, store: SessionStore) -> None:
        self.state = state
        self.redis = state.redis
        self.store = store

    # -- the composed operations -----------------------------------------------------------------

    def merge(self, spec: MergeSpec) -> Merged:
        """``Registry.merge``'s steps for a checked spec: the errors in the documented order."""
        return _raised(self.run_many([spec])[0])

    def select(self, spec: SelectSpec) -> Merged:
        """``Registry.select``'s steps for a checked spec: the winner merged, the others abandoned."""
        return _raised(self.run_many([spec])[0])

    def run_many(self, specs: Sequence[MergeSpec | SelectSpec]) -> list[Merged | errors.ForkError]:
        """The merges and selects of checked specs, each step of them all in one round trip (the
        records, the children's steps, the parents' steps, the marks; a lineage deeper than one
        link reads each further link on its own): each spec's result, in order, as it would be
        run alone (its ``Merged``, or its ``ForkError`` in the documented order), since each
        step is one spec's atomic script and the parents' steps run in the order given. Two specs
        of one batch see each other as two workers' requests would: a parent's step sees the
        merges written before it in the batch, the records read first do not."""
        out: list[Merged | errors.ForkError | None] = [None] * len(specs)
        merges = [spec.merge if isinstance(spec, SelectSpec) else spec for spec in specs]
        candidates = [spec.candidates if isinstance(spec, SelectSpec) else (spec.child,) for spec in specs]
        losers = [spec.losers if isinstance(spec, SelectSpec) else () for spec in specs]
        read = self._records_many([(m.parent_id, *c) for m, c in zip(merges, candidates, strict=True)],
                                  [m.request_id for m in merges])
        forked_at: dict[int, int] = {}
        for i, (m, found) in enumerate(zip(merges, read, strict=True)):
            try:
                forked_at[i] = self._checked(m, candidates[i], found, isinstance(specs[i], SelectSpec))
            except errors.ForkError as exc:
                out[i] = exc
        live = list(forked_at)
        child_steps = self._many([self._read_op(merges[i]) for i in live])
        writes: list[tuple[int, lua.Call, tuple[int, int]]] = []
        for i, reply in zip(live, child_steps, strict=True):
            try:
                got = _read_result(merges[i], reply)
                writes.append((i, self._write_op(merges[i], got, forked_at[i], losers[i]), got[:2]))
            except errors.ForkError as exc:
                out[i] = exc
        parent_steps = self._many([op for _, op, _ in writes], in_order=True)
        done: list[tuple[int, Merged]] = []
        for (i, _, seqs), reply in zip(writes, parent_steps, strict=True):
            try:
                done.append((i, self._write_result(merges[i], seqs, losers[i], reply)))
            except errors.ForkError as exc:
                out[i] = exc
        if self.state.cluster and done:
            # The lifecycle stream lives in another slot than the parents: each merged parent's
            # flush follows its step, also for a merge its retry finds done (the run that wrote it
            # may have died before this; a flush asked twice is flushed twice, harmlessly).
            with self.redis.pipeline(transaction=False) as pipe:
                for _, merged in done:
                    self.state.emit(pipe, "session/flush", merged.parent, merged.length)
                pipe.execute()
        self._mark_many([(merges[i], merged, losers[i]) for i, merged in done])
        for i, merged in done:
            out[i] = merged
        return [result for result in out if result is not None]

    # -- reads -----------------------------------------------------------------------------------

    def _checked(self, spec: MergeSpec, children: Sequence[str], read: list[_Record], select: bool) -> int:
        """The checks on the records read: ``SESSION_NOT_FOUND`` (the parent, then each child),
        ``SESSION_NOT_LIVE`` (the parent; its step checks again) unless this request planned its
        merge already (a retry: it answers its first merge), then each child's lineage
        (``_check_lineage``) and, for a select, a candidate merged before (a stale selection).
        Returns the merged child's ``forkedAt``."""
        pid, instance = split_ref(spec.parent)
        parent, found = read[0], dict(zip(children, read[1:], strict=True))
        if not parent.exists:
            raise errors.not_found(pid)
        for cid, got in found.items():
            if not got.exists:
                raise errors.not_found(cid)
        retry = any(got.planned for got in found.values())
        if not retry and parent.instance is None:
            raise errors.disposed(pid)
        if not retry and instance and parent.instance != instance:
            raise errors.not_live(pid)
        forked_at = {cid: self._check_lineage(spec, cid, got) for cid, got in found.items()}
        if select:
            for cid, got in found.items():
                if got.merged_into is not None and not (spec.request_id and got.merged_into[2] == spec.request_id):
                    into, seq, req = got.merged_into  # a stale selection: a candidate merged before
                    raise errors.already_merged(cid, into, _shown(req), seq)
        return forked_at[spec.child]

    def _records(self, ids: Sequence[str], request_id: str = "") -> list[_Record]:
        return self._records_many([ids], [request_id])[0]

    def _records_many(self, groups: Sequence[Sequence[str]], request_ids: Sequence[str]) -> list[list[_Record]]:
        """The records of each group of session ids (with the plan field of its request id, when
        given), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for ids, request_id in zip(groups, request_ids, strict=True):
            fields = [*_RECORD, plan_field(request_id)] if request_id else list(_RECORD)
            for sid in ids:
                pipe.hmget(keys.session(sid), fields)
        rows = iter(pipe.execute())
        out: list[list[_Record]] = []
        for ids in groups:
            group = []
            for header, instance, parent, seedlen, length, merged, abandoned, *plan in (next(rows) for _ in ids):
                n = 0 if length is None else int(length)
                group.append(_Record(
                    exists=header is not None, instance=None if instance is None else wire.text(instance),
                    parent=records.parent_of(header, parent), seed_length=n if seedlen is None else int(seedlen),
                    length=n, merged_into=None if merged is None else _merged_into.decode(merged),
                    abandoned=None if abandoned is None else wire.text(abandoned), planned=bool(plan and plan[0])))
            out.append(group)
        return out

    def _check_lineage(self, spec: MergeSpec, child: str, record: _Record) -> int:
        """``forkedAt``: the ``seedLength`` of the session of ``child``'s chain that was forked from
        the parent. ``NOT_DESCENDANT`` when the chain does not reach it, then ``ALREADY_MERGED``
        for a child a select abandoned. Each link is read once (one round trip per level)."""
        target = spec.parent_id
        at, link, depth = record, child, 0
        while at.parent is not None and at.parent != target and depth < MAX_DEPTH:
            link, depth = at.parent, depth + 1
            (at,) = self._records([link])
        if at.parent != target or child == target:
            raise errors.not_descendant(child, target)
        if record.abandoned is not None and not (spec.request_id and record.abandoned == spec.request_id):
            raise errors.abandoned(child, _shown(record.abandoned))
        return at.seed_length

    def _read_op(self, spec: MergeSpec) -> lua.Call:
        """The child's step (``merge_read.lua``, read-only but for the plan): which of its events
        (mode ``summary``: none); with a request id it keeps the range it resolved in the child's
        record (``plan_field``), and a retry takes that range, whatever the child holds now."""
        cid = spec.child
        return self.state.scripts.op(
            "merge_read", record=keys.session(cid), turns=keys.session_turns(cid), log=keys.session_log(cid),
            if_length="" if spec.if_child_length is None else spec.if_child_length,
            from_seq="" if spec.from_seq is None else spec.from_seq,
            to_seq="" if spec.to_seq is None else spec.to_seq, most=MAX_MERGE_EVENTS,
            events="1" if spec.mode == "events" else "0", most_bytes=MAX_MERGE_BYTES,
            plan=plan_field(spec.request_id) if spec.request_id else "")

    # -- writes ----------------------------------------------------------------------------------

    def _write_op(self, spec: MergeSpec, read: tuple[int, int, list[bytes]], forked_at: int,
                  others: Sequence[str]) -> lua.Call:
        """The parent's step (``merge.lua``): the merge's turn, written at once or not at all.
        ``INVALID_REQUEST`` for an event of it over the size limit, before any write."""
        from_seq, to_seq, stored = read
        pid, instance = split_ref(spec.parent)
        events = self.merge_events(spec, (from_seq, to_seq), forked_at, stored, self.state.clock())
        return self.state.scripts.op(
            "merge", record=keys.session(pid), log=keys.session_log(pid), turns=keys.session_turns(pid),
            merges=keys.session_merges(pid), lifecycle=self.state.lifecycle_key, instance=instance,
            if_length="" if spec.if_parent_length is None else spec.if_parent_length,
            request_id=spec.request_id, merge_key=merge_key(spec.child, from_seq, to_seq), child=spec.child,
            others=" ".join(others), maxlen=self.state.lifecycle_maxlen, session_id=pid, events=events)

    def _write_result(self, spec: MergeSpec, span: tuple[int, int], others: Sequence[str], reply: Any) -> Merged:
        """What the parent's step answered: the merge, or ``NOT_FOUND``/``NOT_LIVE``,
        ``ALREADY_MERGED``, ``PRECONDITION_FAILED`` (``ifParentLength``), ``OPEN_TURN``; a replay of
        this request id wrote nothing and answers the first merge."""
        from_seq, to_seq = span
        pid, _ = split_ref(spec.parent)
        status = wire.text(reply[0])
        if status in ("OK", "REPLAY"):
            return Merged(pid, spec.child, int(reply[1]), int(reply[2]), from_seq, to_seq, tuple(others))
        if status == "NOT_FOUND":
            raise errors.not_found(pid)
        if status == "NOT_LIVE":
            raise errors.not_live(pid)
        if status == "ALREADY":
            who, req, seq = (wire.text(x) for x in reply[1:4])
            if not seq:
                raise errors.abandoned(who, _shown(req))
            raise errors.already_merged(who, pid, _shown(req), int(seq))
        if status == "PRECONDITION":
            raise errors.precondition_failed(pid, int(reply[1]), int(spec.if_parent_length or 0))
        raise errors.open_merge_turn(pid, wire.text(reply[1]))

    def merge_events(self, spec: MergeSpec, span: tuple[int, int], forked_at: int, stored: Sequence[bytes],
                     now: int) -> list[bytes]:
        """The stored JSON of a merge's turn: ``turn/start {"trigger": "merge"}``, ``session/merge``
        (its ``parentLength`` added by the parent's step), the summary or the range's events (each
        with ``"source": {"session", "seq"}``, its provenance, and the merge's time), then
        ``turn/end {"reason": "merged"}``. ``INVALID_REQUEST`` for an event over the size limit."""
        from_seq, to_seq = span
        merged_from = {"session": spec.child, "fromSeq": from_seq, "toSeq": to_seq}
        head = [NewEvent(rules.TURN_START, {"trigger": "merge"}),
                NewEvent(MERGE_EVENT, {"mergedFrom": merged_from, "mode": spec.mode, "forkedAt": forked_at})]
        if spec.mode == "summary":
            head.append(NewEvent(rules.SUMMARY, {"summary": spec.summary, "summarizes": merged_from}))
        out = self.store.encode_events(head, now)
        for seq, raw in enumerate(stored, start=from_seq):
            body = _event_body.decode(raw)
            body.pop("seq", None)  # the position is the seq (a record of an old layout may hold one)
            body["time"] = now
            body["source"] = {"session": spec.child, "seq": seq}
            out.append(_json.encode(body))
        out += self.store.encode_events([NewEvent(rules.TURN_END, {"reason": "merged"})], now)
        return out

    def _mark_many(self, done: Sequence[tuple[MergeSpec, Merged, Sequence[str]]]) -> None:
        """Each merged child marked merged (``mergedinto``), each select's other candidates
        abandoned, and each entered in the ended index (``keys.ENDED_INDEX``): idempotent, one
        round trip per server."""
        if not done:
            return
        now = self.state.clock()
        ended = None if self.state.cluster else keys.ENDED_INDEX
        ops: list[lua.Call] = []
        for spec, merged, losers in done:
            value = _json.encode([merged.parent, merged.first, spec.request_id])
            ops.append(self.state.scripts.op("mark", record=keys.session(merged.child), ended=ended,
                                             kind="merged", value=value, now=now, session_id=merged.child))
            if ended is not None and losers:  # one server: a select's losers in one call
                ops.append(self.state.scripts.op("mark_many", ended=ended, records=[keys.session(c) for c in losers],
                                                 kind="abandoned", value=spec.request_id or "-", now=now,
                                                 session_ids=list(losers)))
                continue
            ops += [self.state.scripts.op("mark", record=keys.session(cid), ended=ended, kind="abandoned",
                                          value=spec.request_id or "-", now=now, session_id=cid) for cid in losers]
        lua.eval_many(self.redis, ops)
        if self.state.cluster:
            marked = [sid for _, merged, losers in done for sid in (merged.child, *losers)]
            self.redis.zadd(keys.ENDED_INDEX, dict.fromkeys(marked, now), nx=True)

    def _many(self, ops: Sequence[lua.Call], *, in_order: bool = False) -> list[Any]:
        """The replies of ``ops``: one round trip per server (``lua.eval_many``; ``in_order``: each
        server's in the order given, whatever its script cache). One op on a cluster goes through
        the cluster client, which follows a failover's new topology itself."""
        if not ops:
            return []
        if self.state.cluster and len(ops) == 1:
            script, script_keys, args = ops[0]
            return [script(keys=list(script_keys), args=list(args))]
        return lua.eval_many(self.redis, ops, in_order=in_order and len(ops) > 1)


MERGE_EVENT = "session/merge"
"""The type of a merge's second event: where the merged events came from."""


def merge_key(child: str, from_seq: int, to_seq: int) -> str:
    """A merge's key in its parent's merges index (``merge.lua`` reads its seqs back)."""
    return json.dumps(["m", child, from_seq, to_seq], separators=(",", ":"))


def plan_field(request_id: str) -> str:
    """The child's record field that keeps the range a request's merge of it resolved
    (``merge_read.lua``): a retry merges the same range, so the parent's step recognises it."""
    return f"plan:{request_id}"


def _raised(result: Merged | errors.ForkError) -> Merged:
    if isinstance(result, errors.ForkError):
        raise result
    return result


def _read_result(spec: MergeSpec, reply: Any) -> tuple[int, int, list[bytes]]:
    """What the child's step answered: ``(fromSeq, toSeq, stored events)``, or
    ``PRECONDITION_FAILED`` (``ifChildLength``), then ``INVALID_BOUNDARY`` for a range outside the
    child's own events, over ``MAX_MERGE_EVENTS``, or not ending between turns."""
    cid = spec.child
    status = wire.text(reply[0])
    if status == "NOT_FOUND":
        raise errors.not_found(cid)
    if status == "ABANDONED":
        raise errors.abandoned(cid, _shown(wire.text(reply[1])))
    if status == "PRECONDITION":
        raise errors.precondition_failed(cid, int(reply[1]), int(spec.if_child_length or 0))
    if status == "RANGE":
        raise _range_error(spec, wire.text(reply[1]), int(reply[2]), int(reply[3]))
    if status == "INSIDE":
        raise errors.invalid_range(cid, f"toSeq {int(reply[1])} is inside the turn opened at seq {int(reply[2])}: "
                                        "a merge ends between turns")
    if status == "NOINDEX":
        raise errors.invalid_range(cid, "its record was written before turn indexes; fork it once and merge "
                                        "the fork")
    return int(reply[1]), int(reply[2]), list(reply[5:])


def _shown(request_id: str) -> str:
    return "(no request id)" if request_id in ("", "-") else request_id


def _range_error(spec: MergeSpec, why: str, length: int, seed_length: int) -> errors.ForkError:
    cid = spec.child
    if why == "EMPTY":
        return errors.invalid_range(cid, f"it has no completed turn after its seed (seedLength {seed_length}, "
                                         f"{length} events): nothing to merge")
    if why == "SEED":
        return errors.invalid_range(cid, f"fromSeq {spec.from_seq} is inside its seed (seqs 0 to {seed_length - 1}): "
                                         "a merge brings back the child's own events")
    if why == "PAST":
        return errors.invalid_range(cid, f"toSeq {spec.to_seq} is past the end of a log of {length} events")
    if why == "ORDER":
        return errors.invalid_range(cid, f"fromSeq {spec.from_seq} is after toSeq {spec.to_seq}")
    if why == "BYTES":
        return errors.invalid_range(cid, f"the range's events are over {MAX_MERGE_BYTES} bytes: merge it in parts")
    return errors.invalid_range(cid, f"the range holds more than {MAX_MERGE_EVENTS} events: merge it in parts")
