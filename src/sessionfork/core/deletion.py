"""Deletion of sessions (the design is in ``retention``'s docstring): ``Deleter``, the part of
``registry.Registry`` behind ``delete``, ``ask_flush`` and the persistence backend's
``mark_persisted`` (the registry's methods state the contracts), and the release of a parent's
log that deletion and the fork steps share (``Deleter.release``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..core import errors, keys, lua, rules, wire
from .state import RegistryState

DELETED = "deleted"
LIVE = "live"
UNPERSISTED = "unpersisted"
FLUSH_REASK_MS = 60_000
"""A deletion that waits for the backend asks it for a flush at most once per session per minute."""


class Deleter:
    """Deletion on the state's connection; every step is one script on one session's slot."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state
        self.redis = state.redis

    def delete(self, session_id: str, *, only_disposed: bool = False, persisted_first: bool = False) -> str:
        """``Registry.delete``."""
        sid = rules.check_id(session_id)
        state = self.state
        reply = state.scripts("delete", record=keys.session(sid), log=keys.session_log(sid),
                              children=keys.session_children(sid), persisted=keys.session_persisted(sid),
                              turns=keys.session_turns(sid), lifecycle=state.lifecycle_key, now=state.clock(),
                              maxlen=state.lifecycle_maxlen, session_id=sid,
                              only_disposed="1" if only_disposed else "0",
                              persisted_first="1" if persisted_first else "0")
        status = int(reply[0])
        if status == -1:
            raise errors.not_found(sid)
        if status == -2:
            return LIVE
        if status == -3:
            self.ask_flush([(sid, int(reply[1]))])
            return UNPERSISTED
        state.lineages.pop(sid, None)
        parent, left = wire.text(reply[1]), int(reply[2])
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(keys.DISPOSED_INDEX, sid)
        if state.cluster:  # the stream is in another slot: right after the change
            pipe.xadd(keys.LIFECYCLE_STREAM, {"type": "session/deleted", "id": sid, "len": 0,
                                              "header": wire.text(reply[3])},
                      maxlen=state.lifecycle_maxlen, approximate=True)
        pipe.execute()
        if left:  # pinned: free what its descendants do not read (summary children: their kept range)
            self.release(sid, "")
        else:
            self.release(parent, sid)
        return DELETED

    def ask_flush(self, sessions: Sequence[tuple[str, int]]) -> list[str]:
        """``Registry.ask_flush``."""
        state = self.state
        calls: list[lua.Call] = [
            state.scripts.op("flush", asked=keys.session_flush_asked(sid), lifecycle=state.lifecycle_key,
                             interval=FLUSH_REASK_MS, maxlen=state.lifecycle_maxlen, session_id=sid, length=length)
            for sid, length in sessions]
        asked = [(sid, length) for (sid, length), reply in zip(sessions, lua.eval_many(self.redis, calls), strict=True)
                 if int(reply)]
        if asked and state.cluster:  # the stream is in another slot: right after the marks
            pipe = self.redis.pipeline(transaction=False)
            for sid, length in asked:
                state.emit(pipe, "session/flush", sid, length)
            pipe.execute()
        return [sid for sid, _ in asked]

    def mark_persisted(self, session_id: str, length: int) -> None:
        """``Registry.mark_persisted``."""
        sid = rules.check_id(session_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(keys.session_persisted(sid), length)
        pipe.hexists(keys.session(sid), "header")
        if not pipe.execute()[1]:
            # Deleted meanwhile, before the SET landed (delete.lua removes the mark it finds): take
            # back the one just written. A plain SET, not a script: the backend's role may write
            # these marks only.
            self.redis.delete(keys.session_persisted(sid))

    def release(self, parent: str, child: str, need: str = "") -> None:
        """``child`` reads nothing of ``parent``'s log any more (``need`` ""; gone for good, or its
        descendants read only its own events), or only from seq ``need`` on (its descendants read
        less of it); ``child`` "": ``parent`` itself was just deleted. Unpin it or raise its
        need, free what ``parent``'s descendants no longer read if it is deleted, and go up the
        lineage while that lets a deleted ancestor read less of its own parent (each step one
        script on one slot; a step run again changes nothing)."""
        while parent:
            result = self.state.scripts("release", record=keys.session(parent), log=keys.session_log(parent),
                                        children=keys.session_children(parent), turns=keys.session_turns(parent),
                                        needs=keys.session_needs(parent), child=child, need=need)
            if result is None:
                return
            parent, child, need = wire.text(result[0]), parent, wire.text(result[1])
