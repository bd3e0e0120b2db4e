"""What counts as a Redis outage for a worker (``is_outage``: a step that fails with one is retried
after a back-off, never reported as a failure of the request and never a reason to stop the
worker), and as a lost reply for the asyncio client (``is_lost``: the command is sent again, the
subscription reconnected)."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .connections import TRANSIENT

# Error replies of a server that is up but cannot serve for a while: a script or function running
# past ``busy-reply-threshold`` (BUSY), a data set still loading (LOADING), a replica cut off from
# its primary (MASTERDOWN), a cluster reconfiguring (TRYAGAIN, CLUSTERDOWN).
_BUSY_REPLIES = frozenset({"BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"})


def is_outage(exc: BaseException) -> bool:
    """``exc`` means Redis is unreachable or busy for a while (the step may simply be run again),
    or lost its scripts under a step (NOSCRIPT: it restarted empty or was flushed; the script did
    not run, and the step's next run loads it again)."""
    if isinstance(exc, (*TRANSIENT, NoScriptError)):
        return True
    # redis-py prefixes the reply of a pipeline's command it raises: "Command # 2 (HMGET ...) of
    # pipeline caused error: BUSY ...". The reply is what counts.
    reply = str(exc).rpartition(_PIPELINE_PREFIX)[2]
    return isinstance(exc, ResponseError) and reply.split(" ", 1)[0] in _BUSY_REPLIES


_PIPELINE_PREFIX = " of pipeline caused error: "


LOST = (RedisConnectionError, RedisTimeoutError, OSError)
"""How a dropped connection shows: a command failed this way may have run or not."""


def is_lost(exc: BaseException) -> bool:
    """``exc`` means an asyncio connection was lost under a command: ``LOST``, or the
    ``AttributeError`` redis-py's asyncio connection raises when it is closed (by a kill, or by the
    task that saw the kill first) under a command being written: its writer gone, ``'NoneType'
    object has no attribute 'write…'`` (seen under load)."""
    if isinstance(exc, LOST):
        return True
    return isinstance(exc, AttributeError) and "'NoneType' object has no attribute 'write" in str(exc)
