"""The session registry: ``store.SessionStore`` plus the two atomic steps of a fork.

A fork is one script on the source's slot (live? instance? boundary? length?: ``prepare_fork``)
and one on each child's slot (create if absent: ``create_children``). No step touches two
sessions, so forks run unchanged on a Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from msgspec import UNSET
from redis.exceptions import NoScriptError

from ..core import errors, keys, lua, rules, wire
from .config import Settings
from .snapshots import ForkPlan, Snapshot, parse_snapshot
from .store import SessionRef, SessionStore, split_ref
from .wire import Event, Header

__all__ = ["DELETED", "LIVE", "UNPERSISTED", "Registry", "SessionRef"]

DELETED = "deleted"
LIVE = "live"
UNPERSISTED = "unpersisted"


class Registry(SessionStore):
    """The session registry: create, append, read, dispose (``SessionStore``) and fork steps."""

    @classmethod
    def from_settings(cls, redis: Any, settings: Settings) -> Registry:
        """A registry on ``redis`` with the limits and replication wait of ``settings``."""
        return cls(redis, max_event_bytes=settings.max_event_bytes, wait_replicas=settings.wait_replicas,
                   wait_timeout_ms=settings.wait_timeout_ms)

    # -- deletion (design: ``retention``'s docstring) --------------------------------------------

    def delete(self, session_id: str, *, only_disposed: bool = False, persisted_first: bool = False) -> str:
        """Delete a session, live or disposed: afterwards its id answers ``SESSION_NOT_FOUND``
        everywhere and is never reused; no descendant's log changes (a log descendants read is
        kept until the last of them is gone). Returns ``DELETED``; ``LIVE`` when
        ``only_disposed`` and it is live; ``UNPERSISTED`` when ``persisted_first`` and the
        persistence backend does not hold its whole log yet (a ``session/flush`` is emitted:
        ask again once it does). ``SESSION_NOT_FOUND`` when never created or deleted already.
        """
        sid = rules.check_id(session_id)
        reply = self._delete(keys=[keys.session(sid), keys.session_log(sid), keys.session_children(sid),
                                   keys.session_persisted(sid), *self._lifecycle],
                             args=[self._clock(), self.lifecycle_maxlen, sid, "1" if only_disposed else "0",
                                   "1" if persisted_first else "0"])
        status = int(reply[0])
        if status == -1:
            raise errors.not_found(sid)
        if status == -2:
            return LIVE
        if status == -3:
            self.flush(sid)
            return UNPERSISTED
        self._lineages.pop(sid, None)
        parent, left = wire.text(reply[1]), int(reply[2])
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(keys.DISPOSED_INDEX, sid)
        if self._cluster:  # the stream is in another slot: right after the change
            pipe.xadd(keys.LIFECYCLE_STREAM, {"type": "session/deleted", "id": sid, "len": 0,
                                              "header": wire.text(reply[3])},
                      maxlen=self.lifecycle_maxlen, approximate=True)
        pipe.execute()
        if not left:
            self._release_up(parent, sid)
        return DELETED

    def mark_persisted(self, session_id: str, length: int) -> None:
        """The persistence backend holds the first ``length`` events durably (deletion with
        ``persisted_first`` waits for this to reach the session's length)."""
        sid = rules.check_id(session_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(keys.session_persisted(sid), length)
        pipe.hexists(keys.session(sid), "header")
        if not pipe.execute()[1]:
            # Deleted meanwhile, before the SET landed (delete.lua removes the mark it finds): take
            # back the one just written. A plain SET, not a script: the backend's role may write
            # these marks only.
            self.redis.delete(keys.session_persisted(sid))

    def _release_up(self, parent: str, child: str) -> None:
        # ``child`` is gone for good: unpin it from ``parent``, and go up the lineage while that
        # frees a deleted ancestor's log (each step one script on one slot).
        while parent:
            result = self._release(keys=[keys.session(parent), keys.session_log(parent),
                                         keys.session_children(parent)], args=[child])
            if result is None:
                return
            parent, child = wire.text(result), parent

    # -- the two atomic steps of a fork ----------------------------------------------------------

    def take_snapshot(self, source: SessionRef) -> Snapshot:
        """The source step alone: ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE`` or ``OPEN_TURN``."""
        plan = self.prepare_fork(source)
        if plan.error is not None:
            raise plan.error
        assert plan.snapshot is not None
        return plan.snapshot

    def prepare_fork(self, source: SessionRef, child_ids: Sequence[str] = (), *,
                     request_id: str = "") -> ForkPlan:
        """The source step, plus a look at the children-to-be, in one round trip.

        The source step is one script on the source's slot: live? instance? boundary? length?
        Each child id that exists lands in ``existing``, or in ``replayed`` when ``request_id``
        created it (a replay after a crash).
        """
        sid, instance = split_ref(source)  # ids are checked before any Redis call
        checked = [rules.check_id(c) for c in child_ids]
        if self._cluster:
            # A cluster pipeline cannot carry scripts: look at the children, then run the step.
            pipe = self.redis.pipeline(transaction=False)
            for child in checked:
                pipe.hmget(keys.session(child), ["header", "req"])
            taken = pipe.execute() if checked else []
            reply = self._snapshot(keys=[keys.session(sid)], args=[instance])
            return self._plan(sid, checked, request_id, [*taken, reply])
        pipe = self.redis.pipeline(transaction=False)
        parse = self.queue_prepare(pipe, source, checked, request_id=request_id)
        results = pipe.execute(raise_on_error=False)
        if any(isinstance(r, NoScriptError) for r in results):
            self.load_scripts()
            return self.prepare_fork(source, child_ids, request_id=request_id)
        return parse(results)

    def queue_prepare(self, pipe: Any, source: SessionRef, child_ids: Sequence[str] = (), *,
                      request_id: str = "") -> Callable[[list[Any]], ForkPlan]:
        """Queue ``prepare_fork``'s commands on a single server's ``pipe`` (read-only, so safe
        to re-run); returns the parser of their results, which must come last in the pipeline."""
        sid, instance = split_ref(source)
        checked = [rules.check_id(c) for c in child_ids]
        for child in checked:
            pipe.hmget(keys.session(child), ["header", "req"])
        pipe.evalsha(self._snapshot.sha, 1, keys.session(sid), instance)
        count = len(checked) + 1
        return lambda results: self._plan(sid, checked, request_id, results[-count:])

    def load_scripts(self) -> None:
        """Load every script (after a NOSCRIPT: the server restarted or was flushed)."""
        for script in (self._create, self._append, self._snapshot, self._dispose, self._delete, self._release,
                       self._pin, self._settle):
            script.sha = self.redis.script_load(script.script)

    def _plan(self, sid: str, checked: list[str], request_id: str, results: list[Any]) -> ForkPlan:
        *taken, reply = results
        existing: list[str] = []
        replayed: dict[str, Header] = {}
        for child, (header, req) in zip(checked, taken, strict=True):
            if header is None:
                continue
            if request_id and req is not None and wire.text(req) == request_id:
                replayed[child] = wire.decode_header(header)
            else:
                existing.append(child)
        try:
            return ForkPlan(parse_snapshot(sid, reply), None, existing, replayed)
        except errors.ForkError as exc:
            return ForkPlan(None, exc, existing, replayed)

    @property
    def is_cluster(self) -> bool:
        return self._cluster

    def read_snapshot(self, snap: Snapshot) -> list[Event]:
        """The events a snapshot covers: fresh objects, safe for the caller to mutate."""
        return self._read(snap.source.id, self.resolve(snap.source.id, snap.segments), snap.seed_length, 0,
                          snap.length)

    def child_header(self, snap: Snapshot, child_id: str) -> Header:
        return Header(version=wire.HEADER_VERSION, id=child_id, created_at=self._clock(),
                      cwd=snap.source.cwd, parent_session=snap.source.id, seed_length=snap.length)

    def create_children(self, snap: Snapshot, child_ids: Sequence[str], *,
                        request_id: str = "") -> list[Header | errors.ForkError]:
        """The child step for each id: create it from ``snap``, atomically on its own slot.

        One pipelined round trip for all children, which also indexes them under the parent (on
        a cluster, a second round trip does). A child already created by the same ``request_id`` is returned as it is (a
        replay), so a request forks at most once; any other existing id is
        ``SESSION_ALREADY_EXISTS`` in its place of the result. With ``wait_replicas``, the
        children are acknowledged by that many replicas before this returns
        (``lua.NotReplicated`` otherwise).
        """
        checked = [rules.check_id(c) for c in child_ids]
        parent = snap.source.id
        if any(lo < 0 for _, lo, _ in snap.segments):
            # The source's seed holds a reference: store it by value first (once per source), so
            # that its children's reference to it is one level deep whatever the lineage depth.
            resolved = self.resolve(parent, snap.segments)
            self._settle(keys=[keys.session(parent)], args=[wire.encode([list(s) for s in resolved])])
        segments = wire.encode(rules.by_reference(parent, snap.child_segments()))
        last = "turn/end" if snap.length else ""
        # On one server the script also indexes the child under its parent, unless the parent was
        # deleted since the snapshot (atomically); on a cluster the parent's index is in another
        # slot: the children are pinned there first (pin.lua, which checks the same), then created.
        index = [] if self._cluster else [keys.session_children(parent), keys.session(parent)]
        if self._cluster and checked and not self._pin(keys=[keys.session(parent), keys.session_children(parent)],
                                                       args=checked):
            return [errors.not_found(parent) for _ in checked]
        calls: list[lua.Call] = [
            (self._create, [keys.session(cid), *self._lifecycle, *index],
             [wire.encode_header(self.child_header(snap, cid)), self._new_token(), snap.length, snap.length,
              segments, last, request_id, self.lifecycle_maxlen, cid])
            for cid in checked
        ]
        results: list[Header | errors.ForkError] = [
            errors.already_exists(cid) if raw is None else errors.not_found(parent) if raw == -1
            else wire.decode_header(raw)
            for cid, raw in zip(checked, lua.eval_many(self.redis, calls, replicas=self.wait_replicas,
                                                       wait_ms=self.wait_timeout_ms), strict=True)
        ]
        created = [r.id for r in results if isinstance(r, Header)]
        if self._cluster:
            pipe = self.redis.pipeline(transaction=False)
            for cid in created:
                self._emit(pipe, "session/created", cid, snap.length)
            refused = [cid for cid, r in zip(checked, results, strict=True) if not isinstance(r, Header)]
            stale = self._not_children(parent, refused)
            if stale:  # pinned above, but another session owns the id: take the pin back
                pipe.srem(keys.session_children(parent), *stale)
            pipe.execute()
        return results

    def _not_children(self, parent: str, ids: list[str]) -> list[str]:
        """Those of ``ids`` whose record (or tombstone) does not name ``parent`` as its parent."""
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for cid in ids:
            pipe.hmget(keys.session(cid), ["header", "parent"])
        stale = []
        for cid, (header, tomb_parent) in zip(ids, pipe.execute(), strict=True):
            owner = wire.decode_header(header).parent_session if header is not None else \
                (wire.text(tomb_parent) if tomb_parent is not None else None)
            if owner != parent:
                stale.append(cid)
        return stale

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
            lua.wait_for_replicas(self.redis, [keys.session(c.id) for c in replayed], self.wait_replicas,
                                  self.wait_timeout_ms)

    def create_child(self, snap: Snapshot, child_id: str | None = None, *,
                     request_id: str = "") -> Header:
        """``create_children`` for one child (generated id by default); raises on failure."""
        cid = self._new_id() if child_id is None else child_id
        (result,) = self.create_children(snap, [cid], request_id=request_id)
        if isinstance(result, errors.ForkError):
            raise result
        return result
