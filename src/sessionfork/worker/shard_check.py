"""A worker's check that the queue server it serves is the shard it was told it is.

Every server of a sharded queue holds ``sf:shard`` = ``"<index>/<count>"``, written by the first
worker that serves it. A worker given another index or count for that server (shard lists in a
different order, a server listed twice across deployments, a changed number of shards not yet
drained) stops with ``ConfigError`` before it takes a job: serving the wrong shard would leave its
requests' waiters and retries looking elsewhere. An unsharded worker writes nothing and only
refuses a server marked as a shard of several.
"""

from __future__ import annotations

from typing import Any

from ..core import keys, wire
from ..core.config import ENV, ConfigError, redacted


def marker(index: int, count: int) -> str:
    """The marker value of shard ``index`` of ``count``."""
    return f"{index}/{count}"


def check_shard(redis: Any, index: int, count: int, url: str) -> None:
    """Claim (first worker) or check the shard marker of the server ``redis``; ``ConfigError`` when
    the server is marked as another shard. ``url`` is shown in the error (without a password)."""
    want = marker(index, count)
    if count > 1:
        redis.set(keys.SHARD_MARKER, want, nx=True)
    found = redis.get(keys.SHARD_MARKER)
    if found is None or wire.text(found) == want:
        return
    raise ConfigError(
        f"the queue server {redacted(url)} is shard {wire.text(found)} ({keys.SHARD_MARKER}), but this worker was "
        f"given shard {want}: {ENV['queue_urls']} must list the same servers in the same order everywhere; "
        f"after changing the number of shards, drain the queue (docs/sharding.md), then DEL {keys.SHARD_MARKER} "
        "on every queue server")

