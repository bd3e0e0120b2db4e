"""sessionfork: fork live AI-agent sessions kept in Redis, from an RQ queue.

The public API is what ``__all__`` lists here and in ``sessionfork.client``, ``sessionfork.aio``
and ``sessionfork.embedded`` (each pinned by a test, each name in the API reference); everything
else is private and may change. This module is the agent host's side (the registry, forks,
merges and selects, snapshots, branch diff, bundles) and the types a fork's request and reply are
made of; it imports no RQ.
"""

from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

from .core.errors import ErrorCode, ForkError
from .core.forks import FanOut, fork, fork_many, snapshot
from .core.merge_steps import Merged
from .core.merges import MergeOptions, merge, select
from .core.registry import Registry
from .core.snapshots import Snapshot
from .core.wire import (
    ChildError,
    Event,
    ForkFailure,
    ForkResult,
    Header,
    LiveHandle,
    MergedFrom,
    MergedInto,
    MergeFailure,
    MergeReply,
    MergeResult,
    NewEvent,
    Reply,
    SeedMeta,
    SelectFailure,
    SelectReply,
    SelectResult,
    SessionState,
    SessionUsage,
    Summary,
    Usage,
)
from .ops.bundles import BundleManifest, Imported, export_bundle, import_bundle
from .ops.diff import Diff, diff

try:
    __version__: str = _version("sessionfork")
    """The installed distribution's version (``sessionfork --version`` prints it)."""
except _NotInstalled:  # a source tree run without installing it
    __version__ = "0+unknown"

__all__ = [
    "BundleManifest",
    "ChildError",
    "Diff",
    "ErrorCode",
    "Event",
    "FanOut",
    "ForkError",
    "ForkFailure",
    "ForkResult",
    "Header",
    "Imported",
    "LiveHandle",
    "MergeFailure",
    "MergeOptions",
    "MergeReply",
    "MergeResult",
    "Merged",
    "MergedFrom",
    "MergedInto",
    "NewEvent",
    "Registry",
    "Reply",
    "SeedMeta",
    "SelectFailure",
    "SelectReply",
    "SelectResult",
    "SessionState",
    "SessionUsage",
    "Snapshot",
    "Summary",
    "Usage",
    "diff",
    "export_bundle",
    "fork",
    "fork_many",
    "import_bundle",
    "merge",
    "select",
    "snapshot",
]
