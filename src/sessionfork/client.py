"""The scheduler client, public home: ``from sessionfork.client import Client``.

Importing it loads the queue side's client only: no worker, no fork service. Besides ``Client``
it exports what a scheduler annotates and builds: the request (``ForkRequest``, ``ForkOptions``,
``Variant``), the replies (``Reply``: ``ForkResult`` or ``ForkFailure``; ``ChildError``) and the
sharding rule (``shard_of``).
"""

from .clients.client import Client
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
    "ChildError",
    "Client",
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
