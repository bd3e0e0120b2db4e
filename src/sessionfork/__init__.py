"""sessionfork: fork live AI-agent sessions kept in Redis, from an RQ queue.

The public API is what ``__all__`` lists; everything else is private and may change.
"""

from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

from .core.errors import ErrorCode, ForkError
from .core.forks import fork, snapshot
from .core.registry import Registry
from .core.snapshots import Snapshot
from .core.wire import Event, Header, LiveHandle, NewEvent, SeedMeta, Summary

try:
    __version__: str = _version("sessionfork")
    """The installed distribution's version (``sessionfork --version`` prints it)."""
except _NotInstalled:  # a source tree run without installing it
    __version__ = "0+unknown"

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
    "Summary",
    "fork",
    "snapshot",
]
