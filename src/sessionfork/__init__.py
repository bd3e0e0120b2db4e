"""sessionfork: fork live AI-agent sessions kept in Redis, from an RQ queue.

The public API is what ``__all__`` lists; everything else is private and may change.
"""

from .errors import ErrorCode, ForkError
from .forks import fork, snapshot
from .registry import Registry
from .snapshots import Snapshot
from .wire import Event, Header, LiveHandle, NewEvent, SeedMeta

__all__ = [
    "ErrorCode",
    "Event",
    "ForkError",
    "Header",
    "LiveHandle",
    "NewEvent",
    "Registry",
    "SeedMeta",
    "Snapshot",
    "fork",
    "snapshot",
]
