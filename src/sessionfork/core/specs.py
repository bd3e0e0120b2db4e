"""``ForkSpec``, ``MergeSpec``, ``SelectSpec``: one operation each, as every layer under the edge takes it.

A spec is built once where a fork enters: the worker's request parser (``protocol.requests.spec_of``,
from a request checked by ``parse``) and the library's ``forks.fork``/``forks.fork_many`` (their
arguments checked by ``forks.spec``). Downstream nothing unpacks it into keywords: the worker hands
it whole to the core's steps (``forks.source_ops``, ``forks.plan``, ``forks.create``), and they hand
it whole to the Lua argument builders (``fork_steps.snapshot_args``, ``fork_steps.create_args``). A
new fork option is a field here, its check at the two edges, and the script that uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .wire import LiveHandle, NewEvent, Summary, ref_id

Edits = tuple[tuple[NewEvent, ...], ...]
"""Each child's edits, by position: empty (no child has any), or one tuple per child id."""


class ForkSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A fork of ``source`` into ``child_ids`` (checked, distinct), trusted by the core's steps.

    ``request_id``: the idempotency key (``""``: none; a replay returns the children it created).
    ``boundary``: fork at that inclusive seq (``None``: the end of the log, which must close a
    turn). ``if_length``: only if the log has exactly that many events. ``edits``: each child's
    events after its seed, by the position of its id (``()``: none). ``summary``: each child a
    summary child. ``traceparent``: the W3C trace context the request carried (``None``: none).
    """

    source: str | LiveHandle
    child_ids: tuple[str, ...] = ()
    request_id: str = ""
    boundary: int | None = None
    if_length: int | None = None
    edits: Edits = ()
    summary: Summary | None = None
    traceparent: str | None = None

    @property
    def keep_from(self) -> int | None:
        """The summary's ``keepFrom`` (``None`` without a summary)."""
        return None if self.summary is None else self.summary.keep_from

    def edits_by_id(self) -> dict[str, Sequence[NewEvent]]:
        """Each child's edits by its id (children without edits left out)."""
        return {cid: events for cid, events in zip(self.child_ids, self.edits, strict=False) if events}

    def with_children(self, child_ids: Sequence[str]) -> ForkSpec:
        """This spec for ``child_ids`` in place of its own, each edit staying with its position
        (the children an earlier attempt of the request planned, by the claim: same count)."""
        ids = tuple(child_ids)
        if ids == self.child_ids:
            return self
        return msgspec.structs.replace(self, child_ids=ids)


class MergeSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A merge of ``child`` into ``parent`` (an ancestor of it), trusted by the core's steps.

    ``mode``: ``"summary"`` (one ``session/summary`` event holding ``summary``) or ``"events"``
    (the range's events, renumbered, each with its provenance). ``from_seq``/``to_seq``: the
    child's events to merge (``None``: its own events after its seed up to its last completed
    turn). ``if_parent_length``/``if_child_length``: guards. ``request_id``: the idempotency key
    (``""``: none, each call merges anew unless the same range was merged already).
    """

    parent: str | LiveHandle
    child: str
    mode: str
    summary: Any = None
    from_seq: int | None = None
    to_seq: int | None = None
    if_parent_length: int | None = None
    if_child_length: int | None = None
    request_id: str = ""
    traceparent: str | None = None

    @property
    def parent_id(self) -> str:
        """The parent's session id (of a plain id or a live handle)."""
        return ref_id(self.parent)


class SelectSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Best of N: ``merge`` (the winner's merge into the parent) and the other ``candidates``
    (distinct, the winner among them), abandoned in the same request."""

    merge: MergeSpec
    candidates: tuple[str, ...]

    @property
    def request_id(self) -> str:
        """The select's idempotency key: its merge's."""
        return self.merge.request_id

    @property
    def losers(self) -> tuple[str, ...]:
        """The candidates other than the winner, in request order."""
        return tuple(c for c in self.candidates if c != self.merge.child)
