"""What counts as a Redis outage for a worker: a step that fails with one is retried after a
back-off, never reported as a failure of the request and never a reason to stop the worker."""

from __future__ import annotations

from redis.exceptions import ResponseError

from ..core.connections import TRANSIENT

# Error replies of a server that is up but cannot serve for a while: a script or function running
# past ``busy-reply-threshold`` (BUSY), a data set still loading (LOADING), a replica cut off from
# its primary (MASTERDOWN), a cluster reconfiguring (TRYAGAIN, CLUSTERDOWN).
_BUSY_REPLIES = frozenset({"BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"})


def is_outage(exc: BaseException) -> bool:
    """``exc`` means Redis is unreachable or busy for a while (the step may simply be run again)."""
    if isinstance(exc, TRANSIENT):
        return True
    return isinstance(exc, ResponseError) and str(exc).split(" ", 1)[0] in _BUSY_REPLIES
