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

__all__ = ["Registry", "SessionRef"]


class Registry(SessionStore):
    """The session registry: create, append, read, dispose (``SessionStore``) and fork steps."""

    @classmethod
    def from_settings(cls, redis: Any, settings: Settings) -> Registry:
        """A registry on ``redis`` with the limits and replication wait of ``settings``."""
        return cls(redis, max_event_bytes=settings.max_event_bytes, wait_replicas=settings.wait_replicas,
                   wait_timeout_ms=settings.wait_timeout_ms)

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
        for script in (self._create, self._append, self._snapshot, self._dispose):
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
        return self._read(snap.source.id, snap.segments, snap.seed_length, 0, snap.length)

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
        (``lua.NotReplicated`` otherwise). A source that is no longer the session ``snap`` was
        taken from, or is shorter (its server restarted empty), raises ``SESSION_NOT_FOUND`` and
        leaves no child: none may name a seed that cannot be read.
        """
        checked = [rules.check_id(c) for c in child_ids]
        segments = wire.encode(snap.child_segments())
        last = "turn/end" if snap.length else ""
        parent = wire.encode_header(snap.source)
        # On one server the script also indexes the child under its parent and checks that the
        # parent is still the session snapshotted, at least as long (atomically); on a cluster the
        # parent is in another slot: it is indexed, and checked, right after.
        index = [] if self._cluster else [keys.session_children(snap.source.id), keys.session(snap.source.id)]
        calls: list[lua.Call] = [
            (self._create, [keys.session(cid), *self._lifecycle, *index],
             [wire.encode_header(self.child_header(snap, cid)), self._new_token(), snap.length, snap.length,
              segments, last, request_id, self.lifecycle_maxlen, cid, parent])
            for cid in checked
        ]
        replies = lua.eval_many(self.redis, calls, replicas=self.wait_replicas, wait_ms=self.wait_timeout_ms)
        if any(raw == -1 for raw in replies):
            raise self._lost(snap, [c for c, raw in zip(checked, replies, strict=True) if isinstance(raw, bytes)])
        results: list[Header | errors.ForkError] = [
            errors.already_exists(cid) if raw is None else wire.decode_header(raw)
            for cid, raw in zip(checked, replies, strict=True)
        ]
        created = [r.id for r in results if isinstance(r, Header)]
        if created and self._cluster:
            self._check_parent(snap, parent, created)
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(keys.session_children(snap.source.id), *created)
            for cid in created:
                self._emit(pipe, "session/created", cid, snap.length)
            pipe.execute()
            if self.wait_replicas:  # the parent's index entry must survive a failover as the child does
                lua.wait_for_replicas(self.redis, [keys.session_children(snap.source.id)], self.wait_replicas,
                                      self.wait_timeout_ms)
        return results

    def _check_parent(self, snap: Snapshot, parent: bytes, created: list[str]) -> None:
        """On a cluster: the parent must still be the session snapshotted, at least as long, after
        its children were created on other slots; else they are deleted and the fork fails."""
        header, length = self.redis.hmget(keys.session(snap.source.id), ["header", "len"])
        if header != parent or length is None or int(length) < snap.length:
            raise self._lost(snap, created)

    def _lost(self, snap: Snapshot, created: Sequence[str]) -> errors.ForkError:
        """The parent vanished or shrank between the two steps (its server restarted empty or
        lost writes): delete what this call created, whose seed cannot be read, and report the
        source as not found. A retry of the request answers from what the registry holds now."""
        for cid in created:  # only records created from ``snap`` now: no one holds their tokens yet
            self.redis.delete(keys.session(cid), keys.session_log(cid))
        return errors.not_found(snap.source.id)

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

    def create_child(self, snap: Snapshot, child_id: str | None = None, *,
                     request_id: str = "") -> Header:
        """``create_children`` for one child (generated id by default); raises on failure."""
        cid = self._new_id() if child_id is None else child_id
        (result,) = self.create_children(snap, [cid], request_id=request_id)
        if isinstance(result, errors.ForkError):
            raise result
        return result
