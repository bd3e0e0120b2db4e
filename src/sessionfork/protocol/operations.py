"""The operations a request names, one entry each: what the worker, the metrics and the stats read
of an operation instead of switching on it.

An entry names the operation's request type (``op`` on the wire: a fork has none), its reply
types, its edge (``edge``: the request decoded and validated, and its one spec; ``check``: the
spec checked against the registry's rules), its reply (``reply``: what the core wrote, as the
wire's reply), how it runs in a batch (``creates``: a fork's children are planned by its claim and
created by the batch's child steps, ``core.forks.send_many``; a merge's or select's steps run
with the batch's others, ``core.merges.run_many``; ``alone``: it runs as a batch of its own), its
outcome counter (``metric``) and its identity fields (``identity``: the fields of
``wire.IDENTITY_FIELDS`` its request has, which the enqueue script compares; a test pins the
script's list to the table's). Adding an operation is adding an entry (docs/development.md,
"Adding an operation").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgspec

from ..core import forks, merges, wire
from ..core.forks import FanOut
from ..core.merge_steps import Merged
from ..core.registry import Registry
from ..core.specs import ForkSpec, MergeSpec, SelectSpec
from ..core.wire import AnyRequest, Failure, Outcome
from . import merge_requests, requests
from .requests import Limits

Spec: TypeAlias = ForkSpec | MergeSpec | SelectSpec
"""The one spec of a request: a fork's, a merge's or a select's."""
Edge: TypeAlias = Callable[[str | bytes, str, Limits, Callable[[], str]], tuple[AnyRequest, Spec]]
"""``edge(payload, request_id, limits, new_id)``: the request decoded and validated (``INVALID_REQUEST``
naming the field otherwise), and its one spec (``new_id``: the id of a child it leaves unnamed)."""

FORKS: Final = "sessionfork_forks"
"""Counter of fork outcomes by ``code`` (``OK`` or the error code); Prometheus shows ``…_total``."""
MERGES: Final = "sessionfork_merges"
"""Counter of merge and select outcomes by ``op`` (``merge``, ``select``) and ``code``."""


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation's entry (see the module docstring)."""

    name: str
    request: type[Any]
    result: type[Any]
    failure: type[Failure]
    edge: Edge
    check: Callable[[Registry, Any], None]
    reply: Callable[[Any, str, Any], Outcome]
    """``reply(request, request_id, done)``: the wire's reply for what the core returned (a fork's
    ``FanOut``, a merge's ``Merged``); raises the ``ForkError`` that is the request's outcome."""
    describe: Callable[[Any], str]
    """``describe(result)``: its successful reply in a few words (``sessionfork stats``' lines)."""
    metric: str
    creates: bool = False
    alone: bool = False

    @property
    def identity(self) -> tuple[str, ...]:
        """The fields of ``wire.IDENTITY_FIELDS`` this operation's request has, in order."""
        names = {f.encode_name for f in msgspec.structs.fields(self.request)}
        return tuple(name for name in wire.IDENTITY_FIELDS if name in names)

    def labels(self, code: str) -> dict[str, str]:
        """The labels of one outcome on its counter (``metric``): the operation and its code."""
        return {"op": self.name, "code": code}

    def failed(self, request_id: str, code: str, message: str) -> Failure:
        """The operation's failure reply."""
        return self.failure(request_id=request_id, code=code, message=message)


def _fork_edge(payload: str | bytes, request_id: str, limits: Limits,
               new_id: Callable[[], str]) -> tuple[AnyRequest, Spec]:
    fork, edits = requests.parse_edited(payload, request_id, limits)
    return fork, requests.spec_of(fork, request_id, requests.child_ids(fork, new_id), edits)


def _merge_edge(payload: str | bytes, request_id: str, limits: Limits,
                new_id: Callable[[], str]) -> tuple[AnyRequest, Spec]:
    request = merge_requests.parse(payload, request_id, limits, wire.request_op(payload))
    return request, merge_requests.spec_of(request, request_id, limits)


def _merge_reply(request: Any, request_id: str, done: Merged) -> Outcome:
    return merge_requests.reply_of(request_id, done, False)


def _select_reply(request: Any, request_id: str, done: Merged) -> Outcome:
    return merge_requests.reply_of(request_id, done, True)


def _fork_reply(request: Any, request_id: str, done: FanOut) -> Outcome:
    return requests.reply_of(request, request_id, done)


def _fork_words(reply: wire.ForkResult) -> str:
    if not isinstance(reply.session, msgspec.UnsetType):
        return f"{reply.session.id} <- {reply.session.parent_session} (seed {reply.session.seed_length})"
    return "" if isinstance(reply.sessions, msgspec.UnsetType) else f"{len(reply.sessions)} children"


def _merge_words(reply: wire.MergeResult) -> str:
    return f"{reply.merged_from.session} -> {reply.parent} @{reply.from_seq}"


def _select_words(reply: wire.SelectResult) -> str:
    return f"{reply.winner} -> {reply.parent} @{reply.from_seq}, abandoned {len(reply.abandoned)}"


OPERATIONS: Final[dict[str, Operation]] = {
    "fork": Operation("fork", wire.ForkRequest, wire.ForkResult, wire.ForkFailure, _fork_edge, forks.check,
                      _fork_reply, _fork_words, FORKS, creates=True),
    "merge": Operation("merge", wire.MergeRequest, wire.MergeResult, wire.MergeFailure, _merge_edge, merges.check,
                       _merge_reply, _merge_words, MERGES),
    "select": Operation("select", wire.SelectRequest, wire.SelectResult, wire.SelectFailure, _merge_edge,
                        merges.check, _select_reply, _select_words, MERGES, alone=True),
}
"""Every operation, by its ``op`` (a select touches many sessions: it runs as a batch of its own)."""
_BY_REPLY: Final = {kind: op for op in OPERATIONS.values() for kind in (op.result, op.failure)}


def of(name: str) -> Operation:
    """The operation ``name`` (a request's ``op``: ``wire.request_op``)."""
    return OPERATIONS[name]


def of_reply(reply: Outcome) -> Operation:
    """The operation whose reply ``reply`` is."""
    return _BY_REPLY[type(reply)]
