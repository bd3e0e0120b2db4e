"""The two atomic steps of a fork: ``ForkSteps``, the part of ``registry.Registry`` that
``forks`` composes them from.

A fork is one script on the source's slot (live? instance? boundary? length?: ``prepare_fork``)
and one on each child's slot (create if absent: ``create_children``). No step touches two
sessions, so forks run unchanged on a Redis Cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from msgspec import UNSET
from redis import Redis
from redis.commands.core import Script

from ..core import errors, keys, lua, records, rules, wire
from .call_stream import CallStream
from .deletion import Deleter
from .logs import LogReader
from .snapshots import (
    SUMMARY_MARK,
    ChildSeed,
    ForkPlan,
    Snapshot,
    edit_fields,
    parse_snapshot,
    plain_seed,
    summary_seed,
)
from .specs import ForkSpec
from .state import RegistryState
from .store import SessionStore, split_ref
from .wire import Event, Header, NewEvent


def _child_read(child: str) -> tuple[str, ...]:
    """The read of a child's record by the source step: its request id and its header."""
    return ("HMGET", keys.session(child), "req", *records.HEADER_FIELDS)


@dataclasses.dataclass(frozen=True, slots=True)
class ChildStep:
    """A fork's child step, built (``ForkSteps.child_step``) and not run yet: its script ``calls``
    (one per child of ``child_ids``, or one per chunk of them: ``spans``), each child's header as
    created now, its seed's length and its count of edits."""

    snap: Snapshot
    child_ids: list[str]
    calls: list[lua.Call]
    headers: dict[str, Header]
    lengths: dict[str, int]
    edits: dict[str, int]
    spans: list[int]
    """For each call, the children it creates: 0 for a ``create`` call (one child, one reply), else
    a ``create_many`` call's count (its reply: one per child). The calls create the children in
    ``child_ids``' order."""


MANY = 64
"""The most children one ``create_many`` call creates (a fan-out of 1,024: 16 calls, each a few
hundred microseconds of the server's time)."""

_Child = tuple[str, str, dict[str, Any] | None]
"""A child of a child step, as ``child_step`` builds it: its id, its instance token and its edits'
fields of the create script (``edit_fields``; ``None``: no edits of its own)."""

CREATED = 1
"""``create.lua``'s reply for a record it created now: the caller has the header it sent (the
script rebuilds a header's wire JSON only for a record that existed already: a replay)."""


class ForkSteps:
    """The source step of a fork (``prepare_fork``, ``take_snapshot``), the reads of its result
    (``turn_at``, ``read_snapshot``) and the child step (``create_children``), on the state's
    connection; they read logs through ``logs``, encode events as ``store`` does, and release a
    parent's log through ``deletion``."""

    def __init__(self, state: RegistryState, logs: LogReader, store: SessionStore, deletion: Deleter) -> None:
        self.state = state
        self.redis = state.redis
        self.logs = logs
        self.store = store
        self.deletion = deletion

    @property
    def is_cluster(self) -> bool:
        """Whether the connection is a ``RedisCluster`` (the steps then take more round trips)."""
        return self.state.cluster

    # -- the source step -------------------------------------------------------------------------

    def take_snapshot(self, spec: ForkSpec) -> Snapshot:
        """The source step alone: ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE``, ``PRECONDITION_FAILED``
        (with ``if_length``), then ``INVALID_BOUNDARY`` (with ``boundary``) or ``OPEN_TURN`` (without)."""
        plan = self.prepare_fork(spec)
        if plan.error is not None:
            raise plan.error
        assert plan.snapshot is not None
        return plan.snapshot

    def prepare_fork(self, spec: ForkSpec) -> ForkPlan:
        """The source step, plus a look at the children-to-be, in one round trip.

        The source step is one script on the source's slot: live? instance? boundary? length?
        Each child id that exists lands in ``existing``, or in ``replayed`` when the spec's
        ``request_id`` created it (a replay after a crash). With ``if_length``, a source whose log
        does not have exactly that many events is ``PRECONDITION_FAILED``, checked in the same
        script, right after live/instance and before the boundary. A ``boundary`` inside the
        source's inherited seed is checked by one more read on the ancestor that holds that event
        (its events up to there never change, so the check needs no atomicity with the source
        step). A summary's ``keepFrom - 1`` is checked between turns in the same script when it
        falls in the source's own events (one round trip saved), ``INVALID_BOUNDARY`` otherwise;
        elsewhere ``create_children`` checks it. The spec's ids are trusted (checked at its edge).
        """
        ops = self.look_ops(spec)
        if not self.state.cluster:
            return self.plan_of(spec, lua.run(self.redis, ops))
        # A cluster pipeline cannot carry scripts, and the children live on several nodes.
        pipe = self.redis.pipeline(transaction=False)
        for op in ops[:-1]:
            pipe.execute_command(*op)
        taken = pipe.execute() if spec.child_ids else []
        return self.plan_of(spec, [*taken, self._call(ops[-1])])

    def _call(self, op: lua.Op) -> Any:
        """One script call: pipelined on a server; on a cluster through the cluster client, which
        follows a failover's new topology itself."""
        if not self.state.cluster:
            return lua.run(self.redis, [op])[0]
        script, script_keys, args = op
        assert isinstance(script, Script)
        return script(keys=list(script_keys), args=list(args))

    def look_ops(self, spec: ForkSpec) -> list[lua.Op]:
        """The read-only commands of ``prepare_fork`` (the source step last), for ``lua.run`` on the
        registry's server; ``plan_of`` reads their results."""
        if self._probed_together(spec):  # one EXISTS for all; the records read only if any exists
            ops: list[lua.Op] = [("EXISTS", *(keys.session(child) for child in spec.child_ids))]
        else:
            ops = [_child_read(child) for child in spec.child_ids]
        ops.append(self.state.scripts.op("snapshot", **snapshot_args(spec)))
        return ops

    def _probed_together(self, spec: ForkSpec) -> bool:
        """Whether ``look_ops`` probes the spec's children with one ``EXISTS`` (a fan-out on one
        server: most of its ids are new), rather than reading each child's record."""
        return not self.state.cluster and len(spec.child_ids) > 1

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
        segments = self.logs.resolve(sid, snap.segments)  # a reference names the parent, not the owner
        if seq >= snap.seed_length:
            owner, index, summary_first = sid, seq - snap.seed_length, False
        else:
            owner, index = rules.owner_of(segments, seq)
            summary_first = str(segments[0][0]).startswith(SUMMARY_MARK)
        if owner.startswith(SUMMARY_MARK):
            return -1, rules.SUMMARY  # seq 0 of a summary child: before any turn
        turn = self.state.scripts.op("turn", record=keys.session(owner), turns=keys.session_turns(owner),
                                     log=keys.session_log(owner), index=index)
        reply = self._call(turn)
        status = wire.text(reply[0])
        if status != "NOINDEX":
            shift = int(reply[-1]) + index - seq  # owner's seq = sid's seq + shift
            if status == "INSIDE":
                raise inside(int(reply[1]) - shift)
            end = int(reply[1]) - shift
            return (end if int(reply[1]) >= 0 and end >= int(summary_first) else -1), wire.text(reply[2])
        types = [e.type for e in self.logs.read(sid, segments, snap.seed_length, 0, seq + 1)]
        error = rules.check_boundary_in(sid, types, seq)
        if error is not None:
            starts = [i for i, kind in enumerate(types) if kind == rules.TURN_START]
            raise inside(starts[-1]) if starts else error
        ends = [i for i, kind in enumerate(types) if kind == rules.TURN_END]
        return ends[-1] if ends else -1, types[-1]

    def plan_of(self, spec: ForkSpec, results: Sequence[Any]) -> ForkPlan:
        """The ``ForkPlan`` that the results of ``look_ops`` describe."""
        sid, request_id, boundary = wire.ref_id(spec.source), spec.request_id, spec.boundary
        *taken, reply = results
        if self._probed_together(spec):
            if taken[0]:  # some exist: their records, read now (the create script checks again)
                taken = lua.run(self.redis, [_child_read(child) for child in spec.child_ids])
            else:
                taken = [(None, None, None, None)] * len(spec.child_ids)
        existing: list[str] = []
        replayed: dict[str, Header] = {}
        for child, (req, header, cwd, parent) in zip(spec.child_ids, taken, strict=True):
            if header is None:
                continue
            if request_id and req is not None and wire.text(req) == request_id:
                replayed[child] = records.decode_header(child, header, cwd, parent)
            else:
                existing.append(child)
        try:
            snap, unchecked = parse_snapshot(sid, reply, boundary, spec.if_length, spec.keep_from)
            if unchecked and boundary is not None:
                snap = self._check_seed(sid, snap, boundary)
            return ForkPlan(snap, None, existing, replayed)
        except errors.ForkError as exc:
            return ForkPlan(None, exc, existing, replayed)

    def read_snapshot(self, snap: Snapshot) -> list[Event]:
        """The events a snapshot covers: fresh objects, safe for the caller to mutate."""
        sid = snap.source.id
        return self.logs.read(sid, self.logs.resolve(sid, snap.segments), snap.seed_length, 0, snap.length)

    # -- the child step --------------------------------------------------------------------------

    def child_header(self, snap: Snapshot, child_id: str, now: int | None = None,
                     seed: ChildSeed | None = None) -> Header:
        seed = seed or ChildSeed(snap.length, [], None, "")
        return Header(version=wire.HEADER_VERSION, id=child_id, created_at=self.state.clock() if now is None else now,
                      cwd=snap.source.cwd, parent_session=snap.source.id, seed_length=seed.length,
                      kept_from=UNSET if seed.kept_from is None else seed.kept_from)

    def check_keep_from(self, snap: Snapshot, keep_from: int) -> None:
        """The summary rule: ``1 <= keep_from <= E + 1`` (``E`` the snapshot's last seq) and event
        ``keep_from - 1`` between turns, else ``INVALID_BOUNDARY`` naming the source and
        ``keep_from``. One read on the log that holds that event (it never changes)."""
        sid = snap.source.id
        if not 1 <= keep_from <= snap.length:
            raise errors.invalid_keep_from(sid, keep_from, f"expected 1 to {snap.length} (the snapshot's "
                                           f"{snap.length} events)")
        if snap.between_turns == keep_from - 1:
            return  # the source step checked it
        self.turn_at(sid, snap, keep_from - 1,
                     lambda start: errors.invalid_keep_from(sid, keep_from, f"event {keep_from - 1} is inside "
                                                            f"the turn opened at seq {start}"))

    def summary_event(self, source_id: str, summary: wire.Summary, now: int) -> bytes:
        """The stored JSON of a summary child's first event (``INVALID_REQUEST`` as ``append``)."""
        data = {"summary": summary.data,
                "summarizes": {"session": source_id, "fromSeq": 0, "toSeq": summary.keep_from - 1}}
        return self.store.encode_events([NewEvent(rules.SUMMARY, data)], now)[0]

    def create_children(self, snap: Snapshot, spec: ForkSpec,
                        child_ids: Sequence[str] | None = None) -> list[Header | errors.ForkError]:
        """The child step for each of ``child_ids`` (default: the spec's; a subset of them, in the
        spec's order, when some exist already): create it from ``snap``, atomically on its own slot.

        Built by ``child_step`` and run by ``run_children`` (for a batch of requests, a caller
        runs several steps in one round trip), then read by ``children_of``.

        One pipelined round trip for all children, which also indexes them under the parent (on
        a cluster, a second round trip does). A child already created by the same ``request_id`` is returned as it is (a
        replay), so a request forks at most once; any other existing id is
        ``SESSION_ALREADY_EXISTS`` in its place of the result. With ``wait_replicas``, the
        children are acknowledged by that many replicas before this returns
        (``lua.NotReplicated`` otherwise). A source that is no longer the session ``snap`` was
        taken from, or is shorter (its server restarted empty), raises ``SESSION_NOT_FOUND`` and
        leaves no child: none may name a seed that cannot be read.

        The spec's ``edits`` (checked by ``forks.check``) are appended to that child right after
        its seed, in the script that creates it: seqs ``snap.length…``, the fork's time (its
        header's ``createdAt``); ``last``, ``lastend`` and the turn index follow them. A replay
        returns the child as it is, never appending them again.

        The spec's ``summary``: each child is a summary child (``snapshots.summary_seed``;
        ``keep_from`` checked first: ``INVALID_BOUNDARY``), whose edits follow its kept events.
        """
        step = self.child_step(snap, spec, child_ids)
        return self.children_of(step, self.run_children([step])[0])

    def child_step(self, snap: Snapshot, spec: ForkSpec, child_ids: Sequence[str] | None = None) -> ChildStep:
        """``create_children``'s step, built and not run: on a cluster, the children are pinned in
        the parent's index first (a round trip); ``INVALID_BOUNDARY`` for a summary's ``keepFrom``."""
        child_ids = spec.child_ids if child_ids is None else child_ids
        request_id, summary, edits = spec.request_id, spec.summary, spec.edits_by_id()
        source_id = snap.source.id
        state = self.state
        now = state.clock()
        if summary is not None and child_ids:
            self.check_keep_from(snap, summary.keep_from)
            event = self.summary_event(source_id, summary, now)
            seeds = {cid: summary_seed(snap, cid, summary.keep_from, event) for cid in child_ids}
        else:
            plain_one = plain_seed(snap)
            seeds = dict.fromkeys(child_ids, plain_one)
        # The edits were checked before any Redis call (``forks.check``, ``Registry.create_children``):
        # encoded at the fork's time, their values are not walked again, their size is.
        own = {cid: edit_fields(seeds[cid], self.store.encode_events(events, now, checked=True),
                                [e.type for e in events])
               for cid, events in edits.items() if cid in seeds}
        if any(lo < 0 for _, lo, _ in snap.segments):
            # The source's seed holds a reference: store it by value first (once per source), so
            # that its children's reference to it is one level deep whatever the lineage depth.
            resolved = self.logs.resolve(source_id, snap.segments)
            state.scripts("settle", record=keys.session(source_id), seed=wire.encode([list(s) for s in resolved]))
        # The child's "last" feeds the no-boundary rule only; a seed ends between turns, and a
        # boundary fork's seed may end with an event after its turn/end (todo/write): recorded as
        # such, so forking the child without a boundary keeps today's rule (its last event).
        parent = wire.encode_header(snap.source)
        # And as a compact record holds it, for the script's one-string compare (lib/header.lua).
        stored = records.create_args(snap.source)
        parent_stored = {"parent_stored": stored["header"], "parent_cwd": stored["cwd"],
                         "parent_parent": stored["parent_id"]}
        # On one server the script also indexes the child under its parent and checks that the
        # parent is still the session snapshotted (not deleted either), at least as long
        # (atomically); on a cluster the parent is in another slot: the children are pinned in its
        # index first (pin.lua refuses a deleted parent: its log may be freed), and it is checked
        # right after they are created.
        index = {} if state.cluster else {"parent_children": keys.session_children(source_id),
                                           "parent": keys.session(source_id)}
        need = "" if summary is None else summary.keep_from  # a summary child reads the source from K on
        if index and summary is not None:  # only a summary child's pin has a need to record (one key fewer)
            index["parent_needs"] = keys.session_needs(source_id)
        if state.cluster and child_ids and not state.scripts(
                "pin", record=keys.session(source_id), children=keys.session_children(source_id),
                needs=keys.session_needs(source_id), need=need, child_ids=list(child_ids)):
            raise errors.not_found(source_id)
        # What the children of one seed share is built once, not once per child (a fan-out is one
        # seed for all; a summary child has its own): the seed's JSON, the compact record's header
        # fields (no id in them; the old layout's JSON names the id: each child's own), and the
        # log's end for a child without edits of its own.
        headers: dict[str, Header] = {}
        runs: list[tuple[dict[str, Any], list[_Child]]] = []
        last: ChildSeed | None = None
        for cid, seed in seeds.items():
            headers[cid] = header = self.child_header(snap, cid, now, seed)
            if seed is not last:
                last = seed
                runs.append(({"lifecycle": state.lifecycle_key, **index, "seed_length": seed.length,
                              "seed": wire.encode(seed.segments), "request_id": request_id,
                              "maxlen": state.lifecycle_maxlen,
                              "seed_end": "" if seed.seed_end is None else seed.seed_end, "parent_header": parent,
                              "summary": seed.summary or "", "need": need, **parent_stored,
                              **(records.create_args(header) if state.compact_records else {}),
                              "length": seed.length, "last_type": seed.last_type, "last_end": "", "markers": "",
                              "edits": ()}, []))
            runs[-1][1].append((cid, state.new_token(), own.get(cid)))
        calls: list[lua.Call] = []
        spans: list[int] = []
        for common, each in runs:
            self._calls_of(common, each, headers, calls, spans)
        return ChildStep(snap, list(child_ids), calls, headers, {cid: seeds[cid].length for cid in child_ids},
                         {cid: len(events) for cid, events in edits.items()}, spans)

    def _calls_of(self, common: dict[str, Any], each: list[_Child], headers: dict[str, Header],
                  calls: list[lua.Call], spans: list[int]) -> None:
        """The create calls of the children ``each`` of one seed (``common``), in their order,
        appended to ``calls`` (their ``spans`` to ``spans``): on one server, in ``create_many``
        calls of up to ``MANY`` children each (one call's cost shared; a deletion of the parent may
        still land between two), a child with edits of its own carrying them; else (a cluster: each
        child on its own slot) each child in its own ``create`` call."""
        scripts, state = self.state.scripts, self.state
        many = (not state.cluster and state.compact_records and common.get("lifecycle") is not None
                and "parent" in common and "parent_needs" not in common and len(each) > 1)
        if not many:
            calls.extend(scripts.op_each("create", common, [self._create_item(child, headers) for child in each]))
            spans.extend([0] * len(each))
            return
        shared = {name: value for name, value in common.items() if name != "edits"}
        for at in range(0, len(each), MANY):
            run = each[at:at + MANY]
            if len(run) == 1:  # one child: its own call is the cheaper
                calls.extend(scripts.op_each("create", common, [self._create_item(run[0], headers)]))
                spans.append(0)
                continue
            # The words of each child built here, not through a dict of create.lua's names: a
            # child without edits needs only its record's key (create_many.lua's layout).
            child_keys: list[str] = []
            words: list[Any] = []
            for cid, token, fields in run:
                if fields:
                    edits = fields["edits"]
                    child_keys += (keys.session(cid), keys.session_log(cid), keys.session_turns(cid))
                    words += (token, cid, len(edits), fields["length"], fields["last_type"], fields["last_end"],
                              fields["markers"], *edits)
                else:
                    child_keys.append(keys.session(cid))
                    words += (token, cid, 0)
            calls.append(scripts.op("create_many", **shared, children=child_keys, each=words))
            spans.append(len(run))

    def _create_item(self, child: _Child, headers: dict[str, Header]) -> dict[str, Any]:
        """A child's own names in a ``create`` call: its keys, token and id, its edits' fields
        (``edit_fields``) and, for a record of the old layout, its header's."""
        cid, token, fields = child
        item: dict[str, Any] = {"record": keys.session(cid), "log": keys.session_log(cid),
                                "turns": keys.session_turns(cid), "instance": token, "session_id": cid}
        if fields:
            item.update(fields)
        if not self.state.compact_records:
            item.update(records.create_args(headers[cid], compact=False))
        return item

    def run_children(self, steps: Sequence[ChildStep]) -> list[list[Any]]:
        """The replies of each of ``steps``' calls: every step's, in one pipelined round trip (per
        server of a cluster); with ``wait_replicas``, acknowledged by that many replicas
        (``lua.NotReplicated`` otherwise)."""
        state = self.state
        replies = lua.eval_many(self.redis, [call for step in steps for call in step.calls],
                                replicas=state.wait_replicas, wait_ms=state.wait_timeout_ms)
        out, at = [], 0
        for step in steps:
            out.append(self.flat(step, replies[at:at + len(step.calls)]))
            at += len(step.calls)
        return out

    def stream(self) -> CallStream | None:
        """A ``CallStream`` for a batch's child steps, each sent as soon as it is built: on one
        server with no replicas to wait for; else ``None`` (``run_children``: on a cluster, a
        round trip per node; with replicas, a WAIT after them)."""
        redis = self.redis
        if self.state.cluster or self.state.wait_replicas or not isinstance(redis, Redis):
            return None
        return CallStream(redis)

    @staticmethod
    def flat(step: ChildStep, replies: Sequence[Any]) -> list[Any]:
        """One reply per child of ``step`` from its calls' ``replies`` (a ``create_many`` call's
        reply holds one per child: ``spans``)."""
        flat: list[Any] = []
        for reply, span in zip(replies, step.spans, strict=True):
            if span:
                flat.extend(reply)
            else:
                flat.append(reply)
        return flat

    def children_of(self, step: ChildStep, replies: Sequence[Any]) -> list[Header | errors.ForkError]:
        """The result of ``step`` (see ``create_children``) from its calls' ``replies``
        (``run_children``'s): on a cluster, with the steps that follow the children's creation."""
        snap, child_ids, headers, state = step.snap, step.child_ids, step.headers, self.state
        source_id = snap.source.id
        if any(raw == -1 for raw in replies) and not self._deleted(source_id):
            raise self._lost(snap, [c for c, raw in zip(child_ids, replies, strict=True)
                                    if raw == CREATED or isinstance(raw, bytes)])
        # -1 with the parent deleted: a deletion landed among the children. Those created before it
        # pinned its log (delete.lua kept it), so they are whole children and stay, reported; the
        # others are SESSION_NOT_FOUND in their place (a fan-out reports both: no hidden state).
        results: list[Header | errors.ForkError] = [
            errors.already_exists(cid) if raw is None else
            errors.not_found(source_id) if raw == -1 else headers[cid] if raw == CREATED else wire.decode_header(raw)
            for cid, raw in zip(child_ids, replies, strict=True)
        ]
        created = [r.id for r in results if isinstance(r, Header)]
        if state.cluster:
            if created:
                self._check_parent(snap, created)
            pipe = self.redis.pipeline(transaction=False)
            if created:  # pinned already; repeated for records indexed before pins existed
                pipe.sadd(keys.session_children(source_id), *created)
            for cid in created:
                state.emit(pipe, "session/created", cid, step.lengths[cid] + step.edits.get(cid, 0))
            refused = [cid for cid, r in zip(child_ids, results, strict=True) if not isinstance(r, Header)]
            stale = self._not_children(source_id, refused)
            pipe.execute()
            for cid in stale:  # pinned above, but another session owns the id: take the pin back
                # through release.lua: a parent deleted meanwhile whose last pin this was is freed
                self.deletion.release(source_id, cid)
            if state.wait_replicas and created:  # the parent's index entry must survive a failover
                lua.wait_for_replicas(self.redis, [keys.session_children(source_id)], state.wait_replicas,
                                      state.wait_timeout_ms)
        return results

    def _not_children(self, parent: str, ids: list[str]) -> list[str]:
        """Those of ``ids`` whose record (or tombstone) does not name ``parent`` as its parent."""
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for cid in ids:
            pipe.hmget(keys.session(cid), ["header", "parent"])
        stale = []
        for cid, (header, parent_field) in zip(ids, pipe.execute(), strict=True):
            if records.parent_of(header, parent_field) != parent:
                stale.append(cid)
        return stale

    def _check_parent(self, snap: Snapshot, created: list[str]) -> None:
        """On a cluster: the parent must still be the session snapshotted, at least as long, after
        its children were created on other slots; else they are deleted and the fork fails."""
        sid = snap.source.id
        header, cwd, parent_id, length, deleted = self.redis.hmget(
            keys.session(sid), [*records.HEADER_FIELDS, "len", "deleted"])
        if deleted is not None:
            return  # deleted after pin.lua pinned them: its log stays for them, they are whole
        if header is None or records.decode_header(sid, header, cwd, parent_id) != snap.source or length is None \
                or int(length) < snap.length:
            raise self._lost(snap, created)

    def _lost(self, snap: Snapshot, created: Sequence[str]) -> errors.ForkError:
        """The parent vanished or shrank between the two steps (its server restarted empty or
        lost writes): delete what this call created, whose seed cannot be read, and report the
        source as not found. A retry of the request answers from what the registry holds now."""
        for cid in created:  # only records created from ``snap`` now: no one holds their tokens yet
            self.redis.delete(keys.session(cid), keys.session_log(cid), keys.session_turns(cid))
            # And its pin in the parent's index, through release.lua: a parent deleted meanwhile
            # whose last pin this was has its log freed now (a plain SREM would leak it forever).
            self.deletion.release(snap.source.id, cid)
        return errors.not_found(snap.source.id)

    def _deleted(self, sid: str) -> bool:
        """Whether ``sid``'s record is a tombstone (deleted; its log kept while pinned)."""
        return bool(self.redis.hexists(keys.session(sid), "deleted"))

    def confirm_replays(self, replayed: Sequence[Header]) -> None:
        """Finish what an earlier attempt of a request may have left undone for its children.

        That attempt created them, then may have stopped before the steps that follow the child
        step: on a cluster, indexing under the parent and the ``session/created`` event (repeated
        here: consumers are idempotent); anywhere, the WAIT for replicas.
        """
        if not replayed:
            return
        state = self.state
        if state.cluster:
            pipe = self.redis.pipeline(transaction=False)
            for child in replayed:
                if child.parent_session is not UNSET:
                    pipe.sadd(keys.session_children(child.parent_session), child.id)
                state.emit(pipe, "session/created", child.id, 0 if child.seed_length is UNSET else child.seed_length)
            pipe.execute()
        if state.wait_replicas:
            indexes = [keys.session_children(c.parent_session) for c in replayed
                       if state.cluster and c.parent_session is not UNSET]
            lua.wait_for_replicas(self.redis, [*(keys.session(c.id) for c in replayed), *indexes],
                                  state.wait_replicas, state.wait_timeout_ms)


def snapshot_args(spec: ForkSpec) -> dict[str, Any]:
    """``snapshot.lua``'s named KEYS and ARGV for ``spec``'s source step (the source checked:
    ``INVALID_REQUEST`` for a bad id or an empty instance token)."""
    sid, instance = split_ref(spec.source)
    keep_from = spec.keep_from
    return {"record": keys.session(sid), "turns": keys.session_turns(sid), "log": keys.session_log(sid),
            "instance": instance, "boundary": "" if spec.boundary is None else spec.boundary,
            "if_length": "" if spec.if_length is None else spec.if_length,
            "keep": "" if keep_from is None else keep_from - 1, "session_id": sid}
