"""The asyncio scheduler client, public home: ``from sessionfork.aio import AsyncClient``.

Importing it loads no RQ (the client enqueues RQ jobs with a script of its own) and no worker.
Besides ``AsyncClient`` it exports what a scheduler annotates and builds, as ``sessionfork.client``
does: ``ForkRequest``, ``ForkOptions``, ``Variant``, ``Reply``, ``ForkResult``, ``ForkFailure``,
``ChildError`` and ``shard_of``.
"""

from .clients.aio import AsyncClient
from .core.wire import (
    ChildError,
    ForkFailure,
    ForkRequest,
    ForkResult,
    MergeFailure,
    MergeReply,
    MergeRequest,
    MergeResult,
    Reply,
    SelectFailure,
    SelectReply,
    SelectRequest,
    SelectResult,
)
from .protocol.merge_requests import ClientMergeOptions
from .protocol.requests import ForkOptions, Variant
from .protocol.shards import shard_of

__all__ = [
    "AsyncClient",
    "ChildError",
    "ClientMergeOptions",
    "ForkFailure",
    "ForkOptions",
    "ForkRequest",
    "ForkResult",
    "MergeFailure",
    "MergeReply",
    "MergeRequest",
    "MergeResult",
    "Reply",
    "SelectFailure",
    "SelectReply",
    "SelectRequest",
    "SelectResult",
    "Variant",
    "shard_of",
]
