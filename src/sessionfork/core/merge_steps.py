"""The steps of a merge and a select: ``MergeSteps``, the part of ``registry.Registry`` that
``merges`` composes them from.

A merge first looks for its request id's merge in the parent (a retry answers it before any rule),
reads the lineage (the child's ``parentSession`` chain up to the parent: records that never change,
so the reads need no atomicity), then runs one script on the child's slot (which of its events, and
the request's hold on the child: ``merge_read.lua``; a select holds every candidate, on a cluster
each with ``hold.lua`` on its own slot; ``lib/hold.lua``: of two requests that would change one
session's state, one wins), one on the parent's slot (the whole merge turn written at once, or
nothing: ``merge.lua``, which also keeps the merges index that makes a range merge once and a
request id merge once within the request window), then marks the child merged (``mark.lua``; a
select also marks its other candidates abandoned: on one server all in one ``mark_many.lua``
call), the holds let go with the marks (or by ``unhold.lua`` for a refusal). The parent's step is
the one effect: a worker that dies after it leaves a merge its retry recognises by request id, and
marks again (marks are idempotent). No step touches two sessions' slots, so merges and selects run
unchanged on a Redis Cluster, parent and child in different slots. ``MergeSteps.run_many`` runs
each step for many specs at once (a worker's batch): one round trip per step, the parents' steps
in the order given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..core import errors, keys, lua, records, rules, wire
from .settings import ENV
from .specs import MergeSpec, SelectSpec
from .state import RegistryState
from .store import SessionStore, split_ref
from .wire import NewEvent

MAX_MERGE_EVENTS = 10_000
"""Most events one merge of mode ``events`` brings back (``INVALID_BOUNDARY`` beyond: merge the
range in parts)."""
MAX_MERGE_BYTES = 16 * 1024 * 1024
"""The default of the most bytes of stored events one merge of mode ``events`` brings back
(``RegistryState.max_merge_bytes``, ``SESSIONFORK_MAX_REQUEST_WRITE_BYTES``; ``INVALID_BOUNDARY``
beyond: merge the range in parts)."""
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


@dataclass(frozen=True, slots=True)
class _Run:
    """One spec of ``run_many`` as its steps see it."""

    merge: MergeSpec
    candidates: tuple[str, ...]
    """The merge's child, or a select's candidates."""
    losers: tuple[str, ...]
    select: bool
    holder: str
    """What its holds are named by (``lib/hold.lua``): the request id, or a token of the call's own."""


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
        records and the request ids' earlier merges, the lineages (one more per link of the
        deepest, whatever the number of candidates), the children's steps, the parents' steps, the
        marks): each spec's result, in order, as it would be run alone (its ``Merged``, or its
        ``ForkError`` in the documented order), since each step is one spec's atomic script and
        the parents' steps run in the order given. Two specs of one batch see each other as two
        workers' requests would: a parent's step sees the merges written before it in the batch,
        the records read first do not. A request id that merged within the request window answers
        that merge before any rule is read (its marks written again)."""
        out: list[Merged | errors.ForkError | None] = [None] * len(specs)
        runs = [self._run_of(spec) for spec in specs]
        read, replays = self._read_many(runs)
        done: list[tuple[int, Merged]] = []
        checking: list[int] = []
        for i, (run, found, replay) in enumerate(zip(runs, read, replays, strict=True)):
            if replay is not None:
                done.append((i, replay))
                continue
            try:
                self._check_records(run, found)
            except errors.ForkError as exc:
                out[i] = exc
                continue
            checking.append(i)
        lineages = iter(self._forked_at_many([(runs[i].merge.parent_id, cid, got) for i in checking
                                              for cid, got in zip(runs[i].candidates, read[i][1:], strict=True)]))
        forked_at: dict[int, int] = {}
        for i in checking:
            ats = [next(lineages) for _ in runs[i].candidates]
            try:
                forked_at[i] = self._check_states(runs[i], read[i][1:], ats)
            except errors.ForkError as exc:
                out[i] = exc
        holds = {i: self._hold_ops(runs[i]) for i in forked_at}
        replies = iter(self._many([op for ops in holds.values() for op in ops]))
        writes: list[tuple[int, lua.Call, tuple[int, int]]] = []
        let_go: list[int] = []
        for i, ops in holds.items():
            got = [next(replies) for _ in ops]
            try:
                read_ = _read_result(runs[i].merge, got[0], self.state.max_merge_bytes)
                _held_result(runs[i], got[1:])
                writes.append((i, self._write_op(runs[i], read_, forked_at[i]), read_[:2]))
            except errors.ForkError as exc:
                out[i] = exc
                if len(ops) > 1:  # a cluster's holds, each on its own slot: some may have been taken
                    let_go.append(i)
        parent_steps = self._many([op for _, op, _ in writes], in_order=True)
        for (i, _, seqs), reply in zip(writes, parent_steps, strict=True):
            try:
                done.append((i, self._write_result(runs[i], seqs, reply)))
            except errors.ForkError as exc:
                out[i] = exc
                let_go.append(i)
        self._let_go([runs[i] for i in let_go])
        done.sort(key=lambda item: item[0])
        if self.state.cluster and done:
            # The lifecycle stream lives in another slot than the parents: each merged parent's
            # flush follows its step, also for a merge its retry finds done (the run that wrote it
            # may have died before this; a flush asked twice is flushed twice, harmlessly).
            with self.redis.pipeline(transaction=False) as pipe:
                for _, merged in done:
                    self.state.emit(pipe, "session/flush", merged.parent, merged.length)
                pipe.execute()
        self._mark_many([(runs[i], merged) for i, merged in done])
        for i, merged in done:
            out[i] = merged
        return [result for result in out if result is not None]

    def _run_of(self, spec: MergeSpec | SelectSpec) -> _Run:
        """A spec as its steps see it; a call without a request id holds by a token of its own."""
        merge = spec.merge if isinstance(spec, SelectSpec) else spec
        holder = merge.request_id or "." + self.state.new_call_id()
        if isinstance(spec, SelectSpec):
            return _Run(merge=merge, candidates=spec.candidates, losers=spec.losers, select=True, holder=holder)
        return _Run(merge=merge, candidates=(merge.child,), losers=(), select=False, holder=holder)

    # -- reads -----------------------------------------------------------------------------------

    def _read_many(self, runs: Sequence[_Run]) -> tuple[list[list[_Record]], list[Merged | None]]:
        """Each run's records (its parent's, then its candidates') and the merge its request id
        wrote into its parent within the request window (``None``: none), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        asked = [run for run in runs if run.merge.request_id]
        for run in asked:
            pipe.hget(keys.session_merges(run.merge.parent_id), request_key(run.merge.request_id))
        for run in runs:
            for sid in (run.merge.parent_id, *run.candidates):
                pipe.hmget(keys.session(sid), _RECORD)
        rows = pipe.execute()
        entries = dict(zip((id(run) for run in asked), rows, strict=False))
        records = iter(_record_of(row) for row in rows[len(asked):])
        now = self.state.clock()
        window = self.state.request_ttl * 1000
        read = [[next(records) for _ in range(1 + len(run.candidates))] for run in runs]
        replays: list[Merged | None] = []
        for run in runs:
            entry = entries.get(id(run))
            fields = None if entry is None else wire.text(entry).split()
            if fields is None or now - int(fields[4]) >= window:
                replays.append(None)
                continue
            first, length, from_seq, to_seq = (int(v) for v in fields[:4])
            replays.append(Merged(run.merge.parent_id, run.merge.child, first, length, from_seq, to_seq, run.losers))
        return read, replays

    def _check_records(self, run: _Run, read: list[_Record]) -> None:
        """``SESSION_NOT_FOUND`` (the parent, then each child), then ``SESSION_NOT_LIVE`` (the
        parent; its step checks again)."""
        pid, instance = split_ref(run.merge.parent)
        parent = read[0]
        if not parent.exists:
            raise errors.not_found(pid)
        for cid, got in zip(run.candidates, read[1:], strict=True):
            if not got.exists:
                raise errors.not_found(cid)
        if parent.instance is None:
            raise errors.disposed(pid)
        if instance and parent.instance != instance:
            raise errors.not_live(pid)

    def _check_states(self, run: _Run, read: Sequence[_Record], forked_at: Sequence[int | None]) -> int:
        """Each child's lineage (``NOT_DESCENDANT``: ``forked_at`` is ``None``), then a child a
        select abandoned (``ALREADY_MERGED``), child by child; for a select, then a candidate
        merged before (a stale selection). Returns the merged child's ``forkedAt``."""
        spec = run.merge
        target = spec.parent_id
        for cid, got, at in zip(run.candidates, read, forked_at, strict=True):
            if at is None or cid == target:
                raise errors.not_descendant(cid, target)
            if got.abandoned is not None and not (spec.request_id and got.abandoned == spec.request_id):
                raise errors.abandoned(cid, _shown(got.abandoned))
        if run.select:
            for cid, got in zip(run.candidates, read, strict=True):
                if got.merged_into is not None and not (spec.request_id and got.merged_into[2] == spec.request_id):
                    into, seq, req = got.merged_into  # a stale selection: a candidate merged before
                    raise errors.already_merged(cid, into, _shown(req), seq)
        at = forked_at[run.candidates.index(spec.child)]
        return 0 if at is None else at

    def _records(self, ids: Sequence[str]) -> list[_Record]:
        """The records of ``ids``, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for sid in ids:
            pipe.hmget(keys.session(sid), _RECORD)
        return [_record_of(row) for row in pipe.execute()]

    def _forked_at_many(self, asks: Sequence[tuple[str, str, _Record]]) -> list[int | None]:
        """For each ``(parent, child, the child's record)``: ``forkedAt``, the ``seedLength`` of
        the session of the child's ``parentSession`` chain that was forked from the parent, or
        ``None`` when the chain does not reach it. The chains are walked together, one link a
        step, each session's record read once (one round trip per step, for all the sessions the
        walks reached): candidates that share a lineage share its walk, so a select of 1,024
        siblings 1,000 links below its parent reads about 2,000 records in about 1,000 round trips."""
        out: list[int | None] = [None] * len(asks)
        known: dict[str, _Record] = {}
        walks: dict[tuple[str, str], list[int]] = {}
        for i, (target, cid, record) in enumerate(asks):
            known[cid] = record
            walks.setdefault((target, cid), []).append(i)
        depth = 0
        while walks and depth <= MAX_DEPTH:
            moved: dict[tuple[str, str], list[int]] = {}
            for (target, at), waiting in walks.items():
                parent = known[at].parent
                if parent == target:
                    for i in waiting:
                        out[i] = known[at].seed_length
                elif parent is not None:
                    moved.setdefault((target, parent), []).extend(waiting)
            missing = list(dict.fromkeys(at for _, at in moved if at not in known))
            if missing:
                known.update(zip(missing, self._records(missing), strict=True))
            walks, depth = moved, depth + 1
        return out

    def _hold_ops(self, run: _Run) -> list[lua.Call]:
        """The child's step (``merge_read.lua``): which of its events (mode ``summary``: none), the
        range it resolved kept in its record (its plan: a retry takes that range, whatever the
        child holds now) and the request's holds (``lib/hold.lua``): a select's other candidates
        in the same call on one server; on a cluster each in a call on its own slot (``hold.lua``)."""
        spec = run.merge
        cid = spec.child
        now, window = self.state.clock(), self.state.request_ttl * 1000
        together = () if self.state.cluster else run.losers
        ops = [self.state.scripts.op(
            "merge_read", record=keys.session(cid), turns=keys.session_turns(cid), log=keys.session_log(cid),
            others=[keys.session(c) for c in together],
            if_length="" if spec.if_child_length is None else spec.if_child_length,
            from_seq="" if spec.from_seq is None else spec.from_seq,
            to_seq="" if spec.to_seq is None else spec.to_seq, most=MAX_MERGE_EVENTS,
            events="1" if spec.mode == "events" else "0", most_bytes=self.state.max_merge_bytes,
            holder=run.holder, now=now, window=window, select="1" if run.select else "0", session_id=cid,
            other_ids=list(together))]
        if self.state.cluster:
            ops += [self.state.scripts.op("hold", record=keys.session(c), holder=run.holder, now=now, window=window,
                                          session_id=c) for c in run.losers]
        return ops

    def _let_go(self, runs: Sequence[_Run]) -> None:
        """What refused runs held, let go (``unhold.lua``): one call per run on one server, one
        per record on a cluster; all in one round trip."""
        ops: list[lua.Call] = []
        for run in runs:
            records = [keys.session(c) for c in run.candidates]
            if self.state.cluster:
                ops += [self.state.scripts.op("unhold", records=[r], holder=run.holder) for r in records]
            else:
                ops.append(self.state.scripts.op("unhold", records=records, holder=run.holder))
        if ops:
            lua.eval_many(self.redis, ops)

    # -- writes ----------------------------------------------------------------------------------

    def _write_op(self, run: _Run, read: tuple[int, int, list[bytes]], forked_at: int) -> lua.Call:
        """The parent's step (``merge.lua``): the merge's turn, written at once or not at all.
        ``INVALID_REQUEST`` for an event of it over the size limit, before any write."""
        spec = run.merge
        from_seq, to_seq, stored = read
        pid, instance = split_ref(spec.parent)
        now = self.state.clock()
        events = self.merge_events(spec, (from_seq, to_seq), forked_at, stored, now)
        return self.state.scripts.op(
            "merge", record=keys.session(pid), log=keys.session_log(pid), turns=keys.session_turns(pid),
            merges=keys.session_merges(pid), requests=keys.session_merge_requests(pid),
            lifecycle=self.state.lifecycle_key, instance=instance,
            if_length="" if spec.if_parent_length is None else spec.if_parent_length,
            request_id=spec.request_id, merge_key=merge_key(spec.child, from_seq, to_seq), child=spec.child,
            others=" ".join(run.losers), maxlen=self.state.lifecycle_maxlen, session_id=pid,
            request_key=request_key(spec.request_id) if spec.request_id else "", from_seq=from_seq, to_seq=to_seq,
            now=now, window=self.state.request_ttl * 1000, events=events)

    def _write_result(self, run: _Run, span: tuple[int, int], reply: Any) -> Merged:
        """What the parent's step answered: the merge, or ``NOT_FOUND``/``NOT_LIVE``,
        ``ALREADY_MERGED``, ``PRECONDITION_FAILED`` (``ifParentLength``), ``OPEN_TURN``; a replay of
        this request id wrote nothing and answers the first merge."""
        spec = run.merge
        from_seq, to_seq = span
        pid, _ = split_ref(spec.parent)
        status = wire.text(reply[0])
        if status == "REPLAY":
            from_seq, to_seq = int(reply[3]), int(reply[4])
        if status in ("OK", "REPLAY"):
            return Merged(pid, spec.child, int(reply[1]), int(reply[2]), from_seq, to_seq, run.losers)
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

    def _mark_many(self, done: Sequence[tuple[_Run, Merged]]) -> None:
        """Each merged child marked merged (``mergedinto``), each select's other candidates
        abandoned, and each entered in the ended index (``keys.ENDED_INDEX``), what each request
        held on them let go: idempotent, one round trip per server."""
        if not done:
            return
        now = self.state.clock()
        ended = None if self.state.cluster else keys.ENDED_INDEX
        ops: list[lua.Call] = []
        for run, merged in done:
            rid, holder = run.merge.request_id, run.holder
            value = _json.encode([merged.parent, merged.first, rid])
            ops.append(self.state.scripts.op("mark", record=keys.session(merged.child), ended=ended,
                                             kind="merged", value=value, now=now, session_id=merged.child,
                                             holder=holder))
            losers = merged.abandoned
            if ended is not None and losers:  # one server: a select's losers in one call
                ops.append(self.state.scripts.op("mark_many", ended=ended, records=[keys.session(c) for c in losers],
                                                 kind="abandoned", value=rid or "-", now=now, holder=holder,
                                                 session_ids=list(losers)))
                continue
            ops += [self.state.scripts.op("mark", record=keys.session(cid), ended=ended, kind="abandoned",
                                          value=rid or "-", now=now, session_id=cid, holder=holder)
                    for cid in losers]
        lua.eval_many(self.redis, ops)
        if self.state.cluster:
            marked = [sid for _, merged in done for sid in (merged.child, *merged.abandoned)]
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


def request_key(request_id: str) -> str:
    """A request id's key in its parent's merges index (``merge.lua``): the merge it wrote there,
    for the request window."""
    return json.dumps(["r", request_id], separators=(",", ":"))


def _record_of(row: Sequence[Any]) -> _Record:
    header, instance, parent, seedlen, length, merged, abandoned = row
    n = 0 if length is None else int(length)
    return _Record(exists=header is not None, instance=None if instance is None else wire.text(instance),
                   parent=records.parent_of(header, parent), seed_length=n if seedlen is None else int(seedlen),
                   length=n, merged_into=None if merged is None else _merged_into.decode(merged),
                   abandoned=None if abandoned is None else wire.text(abandoned))


def _held_result(run: _Run, replies: Sequence[Any]) -> None:
    """What a cluster's ``hold.lua`` calls answered for a select's other candidates: the first
    refusal raised (``_refused``)."""
    for reply in replies:
        _refused(wire.text(reply[0]), reply)


def _refused(status: str, reply: Any) -> None:
    """A hold's refusal (``lib/hold.lua``): ``SESSION_NOT_FOUND``, ``ALREADY_MERGED`` (abandoned,
    merged before, or held by another request still running)."""
    if status == "NOT_FOUND":
        raise errors.not_found(wire.text(reply[1]))
    if status == "ABANDONED":
        raise errors.abandoned(wire.text(reply[1]), _shown(wire.text(reply[2])))
    if status == "MERGED":
        into, seq, req = _merged_into.decode(reply[2])
        raise errors.already_merged(wire.text(reply[1]), into, _shown(req), seq)
    if status == "BUSY":
        raise errors.held(wire.text(reply[1]), _shown(wire.text(reply[2])))


def _raised(result: Merged | errors.ForkError) -> Merged:
    if isinstance(result, errors.ForkError):
        raise result
    return result


def _read_result(spec: MergeSpec, reply: Any, most_bytes: int = MAX_MERGE_BYTES) -> tuple[int, int, list[bytes]]:
    """What the child's step answered: ``(fromSeq, toSeq, stored events)``, or
    ``PRECONDITION_FAILED`` (``ifChildLength``), then ``INVALID_BOUNDARY`` for a range outside the
    child's own events, over ``MAX_MERGE_EVENTS``, or not ending between turns."""
    cid = spec.child
    status = wire.text(reply[0])
    _refused(status, reply)
    if status == "PRECONDITION":
        raise errors.precondition_failed(cid, int(reply[1]), int(spec.if_child_length or 0))
    if status == "RANGE":
        raise _range_error(spec, wire.text(reply[1]), int(reply[2]), int(reply[3]), most_bytes)
    if status == "INSIDE":
        raise errors.invalid_range(cid, f"toSeq {int(reply[1])} is inside the turn opened at seq {int(reply[2])}: "
                                        "a merge ends between turns")
    if status == "NOINDEX":
        raise errors.invalid_range(cid, "its record was written before turn indexes; fork it once and merge "
                                        "the fork")
    return int(reply[1]), int(reply[2]), list(reply[5:])


def _shown(request_id: str) -> str:
    return "(no request id)" if request_id in ("", "-") or request_id.startswith(".") else request_id


def _range_error(spec: MergeSpec, why: str, length: int, seed_length: int, most_bytes: int) -> errors.ForkError:
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
        return errors.invalid_range(cid, f"the range's events are over {most_bytes} bytes "
                                         f"({ENV['max_request_write_bytes']}): merge it in parts")
    return errors.invalid_range(cid, f"the range holds more than {MAX_MERGE_EVENTS} events: merge it in parts")
