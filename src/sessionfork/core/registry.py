"""The session registry: ``store.SessionStore`` plus the two atomic steps of a fork.

A fork is one script on the source's slot (live? instance? boundary? length?: ``prepare_fork``)
and one on each child's slot (create if absent: ``create_children``). No step touches two
sessions, so forks run unchanged on a Redis Cluster. The source step is the registry's base
(``sources.SnapshottingStore``); the child step is here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from msgspec import UNSET

from ..core import errors, keys, lua, records, rules, wire
from .config import Settings
from .deletion import DELETED, LIVE, UNPERSISTED
from .snapshots import ChildSeed, Snapshot, edit_fields, plain_seed, summary_seed
from .sources import SnapshottingStore
from .store import SessionRef
from .wire import Header, NewEvent

__all__ = ["CREATED", "DELETED", "LIVE", "UNPERSISTED", "Registry", "SessionRef"]

CREATED = 1
"""``create.lua``'s reply for a record it created now: the caller has the header it sent (the
script rebuilds a header's wire JSON only for a record that existed already: a replay)."""


class Registry(SnapshottingStore):
    """The session registry: create, append, read, dispose (``SessionStore``), delete
    (``DeletingStore``) and the fork steps (the source step: ``SnapshottingStore``)."""

    @classmethod
    def from_settings(cls, redis: Any, settings: Settings) -> Registry:
        """A registry on ``redis`` with the limits and replication wait of ``settings``."""
        return cls(redis, max_event_bytes=settings.max_event_bytes, wait_replicas=settings.wait_replicas,
                   wait_timeout_ms=settings.wait_timeout_ms, compact_records=settings.compact_records)

    @property
    def is_cluster(self) -> bool:
        return self._cluster

    # -- the child step of a fork (the source step: ``SnapshottingStore``) -----------------------

    def child_header(self, snap: Snapshot, child_id: str, now: int | None = None,
                     seed: ChildSeed | None = None) -> Header:
        seed = seed or ChildSeed(snap.length, [], None, "")
        return Header(version=wire.HEADER_VERSION, id=child_id, created_at=self._clock() if now is None else now,
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
        return self.encode_events([NewEvent(rules.SUMMARY, data)], now)[0]

    def create_children(self, snap: Snapshot, child_ids: Sequence[str], *, request_id: str = "",
                        edits: Mapping[str, Sequence[NewEvent]] | None = None,
                        summary: wire.Summary | None = None) -> list[Header | errors.ForkError]:
        """The child step for each id: create it from ``snap``, atomically on its own slot.

        One pipelined round trip for all children, which also indexes them under the parent (on
        a cluster, a second round trip does). A child already created by the same ``request_id`` is returned as it is (a
        replay), so a request forks at most once; any other existing id is
        ``SESSION_ALREADY_EXISTS`` in its place of the result. With ``wait_replicas``, the
        children are acknowledged by that many replicas before this returns
        (``lua.NotReplicated`` otherwise). A source that is no longer the session ``snap`` was
        taken from, or is shorter (its server restarted empty), raises ``SESSION_NOT_FOUND`` and
        leaves no child: none may name a seed that cannot be read. ``child_ids`` are checked by
        the caller.

        ``edits`` (by child id; checked by ``forks.check_edits``) are appended to that child right after
        its seed, in the script that creates it: seqs ``snap.length…``, the fork's time (its
        header's ``createdAt``); ``last``, ``lastend`` and the turn index follow them. A replay
        returns the child as it is, never appending them again.

        ``summary``: each child is a summary child (``snapshots.summary_seed``; ``keep_from``
        checked first: ``INVALID_BOUNDARY``), whose edits follow its kept events.
        """
        source_id = snap.source.id
        now = self._clock()
        if summary is not None and child_ids:
            self.check_keep_from(snap, summary.keep_from)
            event = self.summary_event(source_id, summary, now)
            seeds = {cid: summary_seed(snap, cid, summary.keep_from, event) for cid in child_ids}
        else:
            plain_one = plain_seed(snap)
            seeds = dict.fromkeys(child_ids, plain_one)
        own = {cid: edit_fields(seeds[cid], self.encode_events(events, now), [e.type for e in events])
               for cid, events in (edits or {}).items() if events and cid in seeds}
        if any(lo < 0 for _, lo, _ in snap.segments):
            # The source's seed holds a reference: store it by value first (once per source), so
            # that its children's reference to it is one level deep whatever the lineage depth.
            resolved = self.resolve(source_id, snap.segments)
            self._scripts("settle", record=keys.session(source_id), seed=wire.encode([list(s) for s in resolved]))
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
        index = {} if self._cluster else {"parent_children": keys.session_children(source_id),
                                          "parent": keys.session(source_id)}
        need = "" if summary is None else summary.keep_from  # a summary child reads the source from K on
        if index and summary is not None:  # only a summary child's pin has a need to record (one key fewer)
            index["parent_needs"] = keys.session_needs(source_id)
        if self._cluster and child_ids and not self._scripts(
                "pin", record=keys.session(source_id), children=keys.session_children(source_id),
                needs=keys.session_needs(source_id), need=need, child_ids=list(child_ids)):
            raise errors.not_found(source_id)
        # What the children of one seed share is built once, not once per child (a fan-out is one
        # seed for all; a summary child has its own): the seed's JSON, the compact record's header
        # fields (no id in them; the old layout's JSON names the id: each child's own), and the
        # log's end for a child without edits of its own.
        headers: dict[str, Header] = {}
        runs: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        last: ChildSeed | None = None
        for cid, seed in seeds.items():
            headers[cid] = header = self.child_header(snap, cid, now, seed)
            if seed is not last:
                last = seed
                runs.append(({"lifecycle": self._lifecycle_key, **index, "seed_length": seed.length,
                              "seed": wire.encode(seed.segments), "request_id": request_id,
                              "maxlen": self.lifecycle_maxlen,
                              "seed_end": "" if seed.seed_end is None else seed.seed_end, "parent_header": parent,
                              "summary": seed.summary or "", "need": need, **parent_stored,
                              **(records.create_args(header) if self.compact_records else {}),
                              "length": seed.length, "last_type": seed.last_type, "last_end": "", "markers": "",
                              "edits": ()}, []))
            item: dict[str, Any] = {"record": keys.session(cid), "log": keys.session_log(cid),
                                    "turns": keys.session_turns(cid), "instance": self._new_token(),
                                    "session_id": cid}
            if cid in own:
                item.update(own[cid])
            if not self.compact_records:
                item.update(records.create_args(header, compact=False))
            runs[-1][1].append(item)
        calls = [call for common, each in runs for call in self._scripts.op_each("create", common, each)]
        replies = lua.eval_many(self.redis, calls, replicas=self.wait_replicas, wait_ms=self.wait_timeout_ms)
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
        if self._cluster:
            if created:
                self._check_parent(snap, created)
            pipe = self.redis.pipeline(transaction=False)
            if created:  # pinned already; repeated for records indexed before pins existed
                pipe.sadd(keys.session_children(source_id), *created)
            for cid in created:
                self._emit(pipe, "session/created", cid, seeds[cid].length + len((edits or {}).get(cid, ())))
            refused = [cid for cid, r in zip(child_ids, results, strict=True) if not isinstance(r, Header)]
            stale = self._not_children(source_id, refused)
            pipe.execute()
            for cid in stale:  # pinned above, but another session owns the id: take the pin back
                # through release.lua: a parent deleted meanwhile whose last pin this was is freed
                self._release_up(source_id, cid)
            if self.wait_replicas and created:  # the parent's index entry must survive a failover
                lua.wait_for_replicas(self.redis, [keys.session_children(source_id)], self.wait_replicas,
                                      self.wait_timeout_ms)
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
            self._release_up(snap.source.id, cid)
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
        if self._cluster:
            pipe = self.redis.pipeline(transaction=False)
            for child in replayed:
                if child.parent_session is not UNSET:
                    pipe.sadd(keys.session_children(child.parent_session), child.id)
                self._emit(pipe, "session/created", child.id, 0 if child.seed_length is UNSET else child.seed_length)
            pipe.execute()
        if self.wait_replicas:
            indexes = [keys.session_children(c.parent_session) for c in replayed
                       if self._cluster and c.parent_session is not UNSET]
            lua.wait_for_replicas(self.redis, [*(keys.session(c.id) for c in replayed), *indexes],
                                  self.wait_replicas, self.wait_timeout_ms)

    def create_child(self, snap: Snapshot, child_id: str | None = None, *, request_id: str = "",
                     edits: Sequence[NewEvent] = (), summary: wire.Summary | None = None) -> Header:
        """``create_children`` for one child (generated id by default); raises on failure."""
        cid = self._new_id() if child_id is None else rules.check_id(child_id)
        (result,) = self.create_children(snap, [cid], request_id=request_id, edits={cid: edits}, summary=summary)
        if isinstance(result, errors.ForkError):
            raise result
        return result
