"""Deletion of sessions (the design is in ``retention``'s docstring): ``DeletingStore``, the
registry's base that adds ``delete`` and the persistence backend's ``mark_persisted``."""

from __future__ import annotations

from collections.abc import Sequence

from ..core import errors, keys, lua, rules, wire
from .store import SessionStore

DELETED = "deleted"
LIVE = "live"
UNPERSISTED = "unpersisted"
FLUSH_REASK_MS = 60_000
"""A deletion that waits for the backend asks it for a flush at most once per session per minute."""


class DeletingStore(SessionStore):
    """``SessionStore`` plus deletion; every step is one script on one session's slot."""

    def delete(self, session_id: str, *, only_disposed: bool = False, persisted_first: bool = False) -> str:
        """Delete a session, live or disposed: afterwards its id answers ``SESSION_NOT_FOUND``
        everywhere and is never reused; no descendant's log changes (a log descendants read is
        kept until the last of them is gone). Returns ``DELETED``; ``LIVE`` when
        ``only_disposed`` and it is live; ``UNPERSISTED`` when ``persisted_first`` and the
        persistence backend does not hold its whole log yet (a ``session/flush`` is emitted, at
        most once a minute per session: ``ask_flush``; ask again once the backend holds it).
        ``SESSION_NOT_FOUND`` when never created or deleted already.
        """
        sid = rules.check_id(session_id)
        reply = self._scripts("delete", record=keys.session(sid), log=keys.session_log(sid),
                              children=keys.session_children(sid), persisted=keys.session_persisted(sid),
                              turns=keys.session_turns(sid), lifecycle=self._lifecycle_key, now=self._clock(),
                              maxlen=self.lifecycle_maxlen, session_id=sid, only_disposed="1" if only_disposed else "0",
                              persisted_first="1" if persisted_first else "0")
        status = int(reply[0])
        if status == -1:
            raise errors.not_found(sid)
        if status == -2:
            return LIVE
        if status == -3:
            self.ask_flush([(sid, int(reply[1]))])
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
        if left:  # pinned: free what its descendants do not read (summary children: their kept range)
            self._release_up(sid, "")
        else:
            self._release_up(parent, sid)
        return DELETED

    def ask_flush(self, sessions: Sequence[tuple[str, int]]) -> list[str]:
        """Emit ``session/flush`` for each ``(id, length)`` unless one was asked for it within
        ``FLUSH_REASK_MS``: the persistence backend reads every entry of its consumer group, so
        one request is enough; the interval re-asks a backend that lost one. One round trip per
        server; returns the ids asked now."""
        calls: list[lua.Call] = [
            self._scripts.op("flush", asked=keys.session_flush_asked(sid), lifecycle=self._lifecycle_key,
                             interval=FLUSH_REASK_MS, maxlen=self.lifecycle_maxlen, session_id=sid, length=length)
            for sid, length in sessions]
        asked = [(sid, length) for (sid, length), reply in zip(sessions, lua.eval_many(self.redis, calls), strict=True)
                 if int(reply)]
        if asked and self._cluster:  # the stream is in another slot: right after the marks
            pipe = self.redis.pipeline(transaction=False)
            for sid, length in asked:
                self._emit(pipe, "session/flush", sid, length)
            pipe.execute()
        return [sid for sid, _ in asked]

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

    def _release_up(self, parent: str, child: str, need: str = "") -> None:
        # ``child`` reads nothing of ``parent``'s log any more (``need`` ""; gone for good, or its
        # descendants read only its own events), or only from seq ``need`` on (its descendants read
        # less of it); ``child`` "": ``parent`` itself was just deleted. Unpin it or raise its
        # need, free what ``parent``'s descendants no longer read if it is deleted, and go up the
        # lineage while that lets a deleted ancestor read less of its own parent (each step one
        # script on one slot; a step run again changes nothing).
        while parent:
            result = self._scripts("release", record=keys.session(parent), log=keys.session_log(parent),
                                   children=keys.session_children(parent), turns=keys.session_turns(parent),
                                   needs=keys.session_needs(parent), child=child, need=need)
            if result is None:
                return
            parent, child, need = wire.text(result[0]), parent, wire.text(result[1])
