"""The session registry: ``Registry``, a facade over its parts.

Each part is a class of its own module, holding the one ``state.RegistryState`` (the connection,
its scripts, the clock and id factories, the limits, the lineage cache) and the parts it needs:

* ``logs.LogReader``: a log across its lineage (``events``, ``resolve``);
* ``store.SessionStore``: create, append, dispose, flush, the record's reads;
* ``deletion.Deleter``: delete, the flush requests and persistence marks of deletion;
* ``fork_steps.ForkSteps``: the two atomic steps of a fork (the source step, the child step), on
  ``logs``, ``store`` and ``deletion``; ``forks`` composes a fork from them;
* ``merge_steps.MergeSteps``: a merge's and a select's steps, on ``store``; ``merges`` composes them.

The facade delegates what its users call (agent hosts, ``ops``, ``cli``, the retention sweep,
tools and tests), one line each, and states the contracts of all but the fork steps (stated on
``ForkSteps``); ``forks`` calls the fork steps on ``Registry.forks``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from redis import Redis
from redis.cluster import RedisCluster

from ..core import errors, rules, wire
from .config import Settings
from .deletion import DELETED, LIVE, UNPERSISTED, Deleter
from .fork_steps import CREATED, ForkSteps
from .logs import LogReader
from .merge_steps import MergeSteps
from .snapshots import ForkPlan, Segments, Snapshot
from .specs import ForkSpec
from .state import RegistryOptions, RegistryState
from .store import SessionRef, SessionStore
from .wire import Event, Header, LiveHandle, NewEvent, SessionState

__all__ = ["CREATED", "DELETED", "LIVE", "UNPERSISTED", "Registry", "SessionRef"]


class Registry:
    """The session registry on one Redis connection (a ``Redis`` or a ``RedisCluster``): create,
    append, read, dispose, delete, and the fork steps (on ``forks``).

    Options (keywords, all optional): ``clock`` returns Unix epoch milliseconds; ``new_id``,
    ``new_token`` and ``new_call_id`` make session ids, instance tokens and append-call ids (all
    injected so tests can pin them); ``max_event_bytes`` (1 MiB) bounds one stored event;
    ``lifecycle_maxlen`` (1,000,000) trims the lifecycle stream; ``wait_replicas`` (0) and
    ``wait_timeout_ms`` (1000): a fork's children are acknowledged by that many replicas;
    ``compact_records`` (True): write records in the compact layout (``records``), False the old
    one, for readers of an earlier version still running (``SESSIONFORK_COMPACT_RECORDS=0``);
    ``request_ttl`` (86,400 s): how long a merge's request id is remembered, the request window
    (``SESSIONFORK_OUTCOME_TTL``); ``max_merge_bytes`` (16 MiB): most bytes of events one merge
    brings back (``SESSIONFORK_MAX_REQUEST_WRITE_BYTES``).
    """

    def __init__(self, redis: Redis | RedisCluster, **options: Unpack[RegistryOptions]) -> None:
        self.state = RegistryState(redis, **options)
        """What the parts share: the connection, scripts, factories, limits and lineage cache."""
        self.logs = LogReader(self.state)
        """The read path: a log across its lineage."""
        self.store = SessionStore(self.state)
        """Sessions: create, append, dispose, flush, the record's reads."""
        self.deletion = Deleter(self.state)
        """Deletion, its flush requests, the persistence marks, the release of a parent's log."""
        self.forks = ForkSteps(self.state, self.logs, self.store, self.deletion)
        """The fork steps, which ``forks`` composes (patch them here to reach a fork's path)."""
        self.merges = MergeSteps(self.state, self.store)
        """The merge and select steps, which ``merges`` composes."""

    @property
    def redis(self) -> Redis | RedisCluster:
        """The registry's connection (every part uses this one)."""
        return self.state.redis

    @classmethod
    def from_settings(cls, redis: Any, settings: Settings) -> Registry:
        """A registry on ``redis`` with the limits and replication wait of ``settings``."""
        return cls(redis, max_event_bytes=settings.max_event_bytes, wait_replicas=settings.wait_replicas,
                   wait_timeout_ms=settings.wait_timeout_ms, compact_records=settings.compact_records,
                   request_ttl=settings.outcome_ttl, max_merge_bytes=settings.max_request_write_bytes)

    # -- sessions (``store.SessionStore``) -------------------------------------------------------

    def create(self, session_id: str | None = None, *, cwd: str | None = None) -> LiveHandle:
        """Create a live session; raises ``SESSION_ALREADY_EXISTS`` if the id was ever used.

        A session id outside the id rule, or a ``cwd`` that is not text, is ``INVALID_REQUEST``
        before any Redis call."""
        return self.store.create(session_id, cwd=cwd)

    def append(self, session: SessionRef, events: Sequence[NewEvent], *,
               expect_length: int | None = None, time_ms: int | None = None,
               usage: wire.Usage | None = None) -> list[Event]:
        """Append events to a live session; returns them with their ``seq`` and ``time``.

        Concurrent appenders never produce a gap or a duplicate seq (the script assigns the
        positions). A batch holding a ``turn/end`` emits ``session/flush``. With
        ``expect_length``, nothing is appended unless the log has exactly that many events
        (``LengthMoved``). Raises ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE``, and
        ``INVALID_REQUEST`` for an event over ``max_event_bytes``, or whose data is not JSON that
        reads back identically (``wire.encode_stored_event``), before any Redis call.

        ``usage`` (a ``wire.Usage``: what producing these events consumed) is added to the
        session's own usage counters in the same atomic step, once: a retried call adds nothing
        again. Usage on an empty append, or anything but a ``Usage``, is ``INVALID_REQUEST``.
        """
        return self.store.append(session, events, expect_length=expect_length, time_ms=time_ms, usage=usage)

    def encode_events(self, events: Sequence[NewEvent], time_ms: int) -> list[bytes]:
        """The stored JSON of ``events`` at ``time_ms``: ``INVALID_REQUEST`` for an event that is
        not JSON that reads back identically, or over ``max_event_bytes`` (``append``'s rules)."""
        return self.store.encode_events(events, time_ms)

    def dispose(self, session: SessionRef) -> None:
        """End the live incarnation; header and events stay readable, the id is never reused.

        The session enters the retention index (``keys.DISPOSED_INDEX``, scored by this time).
        """
        self.store.dispose(session)

    def flush(self, session_id: str) -> None:
        """Emit ``session/flush`` on demand: persistence backends write what they miss."""
        self.store.flush(session_id)

    def header(self, session_id: str) -> Header:
        """The header of a session, live or disposed; ``SESSION_NOT_FOUND`` if never created."""
        return self.store.header(session_id)

    def instance(self, session_id: str) -> str | None:
        """The live instance token, or ``None`` when the session is not live."""
        return self.store.instance(session_id)

    def length(self, session_id: str) -> int:
        """The number of events in the session's log, seed included (0 when never created)."""
        return self.store.length(session_id)

    def last_turn_end(self, session_id: str) -> int | None:
        """The seq of the session's newest ``turn/end`` (its last completed turn), seed included:
        one O(1) read, kept by every append. ``None`` when it has none (or is a record written
        before turn indexes). Always a valid fork boundary, now and after any later append (the
        events up to it never change), so ``fork(..., boundary=last_turn_end(id))`` forks a
        running session at its last completed turn. ``SESSION_NOT_FOUND`` if never created.
        """
        return self.store.last_turn_end(session_id)

    def state_of(self, session_id: str) -> SessionState:
        """Where a session stands (``SessionState``: live, merged, abandoned, disposed or deleted),
        in one read. ``SESSION_NOT_FOUND`` if never created (or gone for good)."""
        return self.store.state_of(session_id)

    def exists(self, session_id: str) -> bool:
        """True for a live or disposed session; False when never created or deleted."""
        return self.store.exists(session_id)

    def children(self, session_id: str) -> list[str]:
        """Ids of the sessions forked from this one, sorted."""
        return self.store.children(session_id)

    def usage(self, session_id: str) -> wire.SessionUsage:
        """The session's own usage (what its appends carried; the seed's is its ancestors') and its
        subtree's total (itself and every descendant: live, merged, abandoned, disposed, deleted).

        Each append with usage adds to its session's counters and, on one server, to its tree
        root's totals (the same cost at any lineage depth). A root's total on one server is one
        read, deleted descendants included; any other session's (and every one on a cluster) is
        summed when read, one round trip per level of its subtree, counting a deleted descendant
        while a descendant of it pins it (``docs/storage.md``, Usage counters).
        ``SESSION_NOT_FOUND`` if never created.
        """
        return self.store.usage(session_id)

    # -- logs (``logs.LogReader``) ---------------------------------------------------------------

    def events(self, session_id: str, start: int = 0, stop: int | None = None) -> list[Event]:
        """Events with ``start <= seq < stop`` (the whole log by default), inherited seed included.

        One pipelined round trip for all the slices, whatever the depth of the lineage; the first
        read of a session also reads its record and, unless cached, its parent's seed (at most three
        round trips; seed references never change, so they are remembered). A session deleted
        meanwhile is ``SESSION_NOT_FOUND``, never a partial log nor an undecodable one.
        """
        return self.logs.events(session_id, start, stop)

    def owners(self, session_id: str) -> list[tuple[str, int, int]]:
        """Who holds each inherited event of the session's seed: ``(ancestor id, first seq, stop
        seq)`` runs, oldest first, covering seqs ``[0, seedLength)`` (a summary child's seq 0 is
        its own); every seq from ``seedLength`` on is the session's own. One read of the record
        at most (none once its lineage is cached). ``SESSION_NOT_FOUND`` if never created."""
        return self.logs.owners(session_id)

    def resolve(self, sid: str, segments: Segments) -> Segments:
        """``segments`` of ``sid``'s seed with every reference (``[parent, -b, -a]``: events
        ``[a, b)`` of the parent's seed; ``[parent, -n, 0]`` its first ``n``) replaced by the slices
        it stands for.

        A reference is one level deep (a fork stores its source's seed by value first), so this
        reads at most one record, and none when the parent's lineage is cached (it never changes).
        """
        return self.logs.resolve(sid, segments)

    # -- deletion (``deletion.Deleter``) ---------------------------------------------------------

    def delete(self, session_id: str, *, only_disposed: bool = False, persisted_first: bool = False) -> str:
        """Delete a session, live or disposed: afterwards its id answers ``SESSION_NOT_FOUND``
        everywhere and is never reused; no descendant's log changes (a log descendants read is
        kept until the last of them is gone). Returns ``DELETED``; ``LIVE`` when
        ``only_disposed`` and it is live; ``UNPERSISTED`` when ``persisted_first`` and the
        persistence backend does not hold its whole log yet (a ``session/flush`` is emitted, at
        most once a minute per session: ``ask_flush``; ask again once the backend holds it).
        ``SESSION_NOT_FOUND`` when never created or deleted already.
        """
        return self.deletion.delete(session_id, only_disposed=only_disposed, persisted_first=persisted_first)

    def ask_flush(self, sessions: Sequence[tuple[str, int]]) -> list[str]:
        """Emit ``session/flush`` for each ``(id, length)`` unless one was asked for it within
        ``deletion.FLUSH_REASK_MS``: the persistence backend reads every entry of its consumer
        group, so one request is enough; the interval re-asks a backend that lost one. One round
        trip per server; returns the ids asked now."""
        return self.deletion.ask_flush(sessions)

    def mark_persisted(self, session_id: str, length: int) -> None:
        """The persistence backend holds the first ``length`` events durably (deletion with
        ``persisted_first`` waits for this to reach the session's length)."""
        self.deletion.mark_persisted(session_id, length)

    # -- fork steps (``fork_steps.ForkSteps``: their contracts; ``forks`` calls them on ``forks``) --

    def take_snapshot(self, source: SessionRef, boundary: int | None = None, *,
                      if_length: int | None = None, keep_from: int | None = None) -> Snapshot:
        """The source step alone (``ForkSteps.take_snapshot``); ``keep_from``: a summary's, checked
        in the step where it can be."""
        return self.forks.take_snapshot(_spec(source, (), boundary=boundary, if_length=if_length,
                                              summary=None if keep_from is None else wire.Summary(keep_from=keep_from)))

    def prepare_fork(self, source: SessionRef, child_ids: Sequence[str] = (), *,
                     request_id: str = "", boundary: int | None = None,
                     if_length: int | None = None, keep_from: int | None = None) -> ForkPlan:
        """The source step and a look at the children-to-be, in one round trip
        (``ForkSteps.prepare_fork``); the child ids are checked first (``INVALID_REQUEST``)."""
        return self.forks.prepare_fork(_spec(source, child_ids, request_id=request_id, boundary=boundary,
                                             if_length=if_length,
                                             summary=None if keep_from is None else wire.Summary(keep_from=keep_from)))

    def check_keep_from(self, snap: Snapshot, keep_from: int) -> None:
        """The summary rule for ``keep_from`` on ``snap`` (``ForkSteps.check_keep_from``)."""
        self.forks.check_keep_from(snap, keep_from)

    def summary_event(self, source_id: str, summary: wire.Summary, now: int) -> bytes:
        """The stored JSON of a summary child's first event (``ForkSteps.summary_event``)."""
        return self.forks.summary_event(source_id, summary, now)

    def create_children(self, snap: Snapshot, child_ids: Sequence[str], *, request_id: str = "",
                        edits: Mapping[str, Sequence[NewEvent]] | None = None,
                        summary: wire.Summary | None = None) -> list[Header | errors.ForkError]:
        """The child step for each id (``ForkSteps.create_children``); ids and edits checked first
        (``INVALID_REQUEST`` before any Redis call)."""
        ids = [rules.check_id(c) for c in child_ids]
        by_id = edits or {}
        for c in ids:
            self.store.encode_events(by_id.get(c, ()), 0)
        return self.forks.create_children(snap, _spec(snap.source.id, ids, request_id=request_id, summary=summary,
                                                      edits=tuple(tuple(by_id.get(c, ())) for c in ids)))

    def create_child(self, snap: Snapshot, child_id: str | None = None, *, request_id: str = "",
                     edits: Sequence[NewEvent] = (), summary: wire.Summary | None = None) -> Header:
        """``create_children`` for one child (generated id by default); raises on failure."""
        cid = self.state.new_id() if child_id is None else child_id
        (result,) = self.create_children(snap, [cid], request_id=request_id, edits={cid: edits}, summary=summary)
        if isinstance(result, errors.ForkError):
            raise result
        return result


def _spec(source: SessionRef, child_ids: Sequence[str], **fields: Any) -> ForkSpec:
    """A spec from the facade's keyword methods (their edge): child ids checked here."""
    return ForkSpec(source=source, child_ids=tuple(rules.check_id(c) for c in child_ids), **fields)
