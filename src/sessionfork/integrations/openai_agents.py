"""The OpenAI Agents SDK's ``Session`` protocol over a sessionfork session: ``SessionforkSession``
(extra ``openai-agents``).

    session = SessionforkSession("chat-1", registry)
    await Runner.run(agent, "hi", session=session)      # the SDK reads and writes its history here
    branch = await session.fork()                       # a child session: O(1), whatever the history
    await Runner.run(agent, "try it another way", session=branch)
    await branch.merge()                                # the branch's items back into chat-1, one turn

The log is append-only. Each call that writes is one turn of the session's log (``turn/start``, its
events, ``turn/end``), so a session forks and merges between any two calls:

* ``add_items(items)``: one ``agents/item`` event per item, ``data`` the item (as ``json`` dumps it);
* ``pop_item()``: an ``agents/pop`` marker (``data``: the item it pops), appended only while the log
  has the length it was read at (``Registry.append(expect_length=...)``), so two concurrent pops
  never pop one item;
* ``clear_session()``: an ``agents/clear`` marker.

A read replays the log: an item is pushed, a pop marker removes the newest item, a clear marker
removes every item; other events (the turns' markers, merges' ``session/merge``, an application's
own) are not items. Events merged from a branch carry ``source`` (the branch they came from): a
marker among them removes only items that branch brought, so a merge brings back the branch's own
items net of its pops and clears, and never removes the parent's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, Final

from agents.items import TResponseInputItem
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from ..core import errors, rules
from ..core.errors import ErrorCode, ForkError
from ..core.forks import fork
from ..core.merge_steps import Merged
from ..core.merges import merge
from ..core.registry import Registry
from ..core.store import LengthMoved
from ..core.wire import Event, NewEvent

__all__ = ["CLEAR", "ITEM", "POP", "SessionforkSession"]

ITEM: Final = "agents/item"
"""An item of the conversation history: ``data`` is the item."""
POP: Final = "agents/pop"
"""``pop_item``'s marker: the newest item is no longer read (``data``: that item)."""
CLEAR: Final = "agents/clear"
"""``clear_session``'s marker: no item before it is read any more."""
TRIGGER: Final = "openai-agents"
"""The ``trigger`` of the ``turn/start`` that opens each write's turn."""

Scoped = tuple[str | None, Any]
"""An item as a read holds it: the branch that brought it by a merge (``None``: the session's own), the item."""


class SessionforkSession:
    """A conversation history of the OpenAI Agents SDK (its ``Session`` protocol: ``get_items``,
    ``add_items``, ``pop_item``, ``clear_session``) kept as the sessionfork session ``session_id``
    of ``registry``, created by its first ``add_items`` (or ``fork``). Reads of a session never
    written are empty. ``session_settings.limit`` is the default ``limit`` of ``get_items``.

    ``fork()`` makes a child session holding this history (by reference: O(1) in its length);
    ``merge()`` brings a branch's own items back into the session it was forked from, as one turn.
    ``INVALID_REQUEST`` (``ForkError``) for an id outside the registry's id rule, or an item that is
    not JSON; ``SESSION_NOT_FOUND`` for a write to a session disposed or deleted by other means.
    """

    session_settings: SessionSettings | None = None

    def __init__(self, session_id: str, registry: Registry, *,
                 session_settings: SessionSettings | None = None) -> None:
        self.session_id = rules.check_id(session_id, "session id")
        self.registry = registry
        self.session_settings = session_settings or SessionSettings()

    def __repr__(self) -> str:
        return f"SessionforkSession({self.session_id!r})"

    # -- the Session protocol ------------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first; with ``limit`` (default: ``session_settings.limit``), its
        newest ``limit`` items, still oldest first (none for ``limit <= 0``)."""
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None and wanted <= 0:
            return []
        _, items = await asyncio.to_thread(self._read)
        return [item for _, item in (items if wanted is None else items[-wanted:])]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` (in order) as one turn, atomically: all of them or none."""
        if not items:
            return
        events = [NewEvent(ITEM, _json(item)) for item in items]
        await asyncio.to_thread(self._write, events, None)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (``None`` when there is none): a ``POP`` marker,
        appended only if nothing was appended since the read that chose the item."""
        return await asyncio.to_thread(self._pop)

    async def clear_session(self) -> None:
        """Remove every item: a ``CLEAR`` marker (nothing is written when the session was never
        created)."""
        await asyncio.to_thread(self._clear)

    # -- branches ------------------------------------------------------------------------------------

    async def fork(self, session_id: str | None = None) -> SessionforkSession:
        """A child session (``session_id``, default a generated ``session-<uuid4>``) whose history is
        this one's now; later writes to either never show in the other. Stored by reference: the
        same cost at any length. ``SESSION_ALREADY_EXISTS`` for an id used before."""
        def run() -> str:
            self._ensure_created()
            return fork(self.registry, self.session_id, session_id).id

        return SessionforkSession(await asyncio.to_thread(run), self.registry, session_settings=self.session_settings)

    async def merge(self, into: SessionforkSession | str | None = None, *, range: tuple[int, int] | None = None,
                    request_id: str | None = None) -> Merged:
        """Bring this branch's items back into ``into`` (default: the session it was forked from; any
        ancestor may be named), as one turn of it, atomically (``sessionfork.merge``, mode
        ``events``): its own events after its seed (``range``: the branch's seqs ``(fromSeq,
        toSeq)`` instead; a later merge of the same branch names the events after the first one's
        ``to_seq``). The items read there next are its items followed by the branch's own, net of
        the branch's pops and clears. ``request_id`` makes a retry return the first merge.
        ``NOT_DESCENDANT``, ``ALREADY_MERGED``, ``INVALID_BOUNDARY`` (nothing of its own to merge)
        as ``sessionfork.merge`` raises them."""
        def run() -> Merged:
            parent = into.session_id if isinstance(into, SessionforkSession) else into
            if parent is None:
                forked_from = self.registry.header(self.session_id).parent_session
                if not isinstance(forked_from, str):
                    raise errors.invalid(f'session "{self.session_id}" was not forked: name the session to merge into')
                parent = forked_from
            return merge(self.registry, parent, self.session_id, mode="events", range=range, request_id=request_id)

        return await asyncio.to_thread(run)

    # -- the registry's side (run in a thread: the registry's calls block) ---------------------------

    def _read(self) -> tuple[int, list[Scoped]]:
        """The log's length and the items a read gives at it (``replay``)."""
        try:
            events = self.registry.events(self.session_id)
        except ForkError as exc:
            if exc.code is ErrorCode.SESSION_NOT_FOUND and not self.registry.exists(self.session_id):
                return 0, []
            raise
        return len(events), replay(events)

    def _ensure_created(self) -> None:
        if not self.registry.exists(self.session_id):
            try:
                self.registry.create(self.session_id)
            except ForkError as exc:  # created meanwhile (another writer): the same session
                if exc.code is not ErrorCode.SESSION_ALREADY_EXISTS:
                    raise

    def _write(self, events: Sequence[NewEvent], expect_length: int | None) -> None:
        """``events`` as one turn; with ``expect_length``, only at that length (``LengthMoved``)."""
        turn = [NewEvent("turn/start", {"trigger": TRIGGER}), *events,
                NewEvent("turn/end", {"reason": {"kind": "completed"}})]
        self.registry.encode_events(turn, 0)  # every item checked before the session is created
        self._ensure_created()
        self.registry.append(self.session_id, turn, expect_length=expect_length)

    def _pop(self) -> TResponseInputItem | None:
        while True:
            length, items = self._read()
            if not items:
                return None
            item: TResponseInputItem = items[-1][1]
            try:
                self._write([NewEvent(POP, item)], length)
            except LengthMoved:
                continue  # another writer came first: read again
            return item

    def _clear(self) -> None:
        if self.registry.exists(self.session_id):
            self._write([NewEvent(CLEAR)], None)


def replay(events: Sequence[Event]) -> list[Scoped]:
    """The items ``events`` leave, oldest first, each with the branch that brought it: an ``ITEM``
    pushes its ``data``; a ``POP`` removes the newest item, a ``CLEAR`` every item; a marker merged
    from a branch (its ``source`` names the branch) removes only items merged from that branch."""
    items: list[Scoped] = []
    for event in events:
        if event.type not in (ITEM, POP, CLEAR):
            continue
        source = event.extra.get("source")
        scope = source.get("session") if isinstance(source, dict) else None
        if event.type == ITEM:
            items.append((scope, event.data))
        elif event.type == CLEAR:
            items = [] if scope is None else [entry for entry in items if entry[0] != scope]
        elif scope is None:
            if items:
                items.pop()
        else:
            at = next((i for i in range(len(items) - 1, -1, -1) if items[i][0] == scope), None)
            if at is not None:
                del items[at]
    return items


def _json(item: Any) -> Any:
    """``item`` as the SDK's own sessions store it (``json.dumps``, read back); ``INVALID_REQUEST``
    for one that is not JSON."""
    try:
        return json.loads(json.dumps(item))
    except (TypeError, ValueError) as exc:
        raise errors.invalid(f"an item that is not JSON: {exc}") from None
