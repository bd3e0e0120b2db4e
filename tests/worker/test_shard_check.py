"""``check_shard`` (docs/sharding.md): the first worker of a shard marks its queue server; an
unsharded worker never writes the marker (a server it served can later become any shard) and
refuses only a server marked as a shard of several."""

from __future__ import annotations

import pytest
from redis import Redis

from sessionfork.core import keys
from sessionfork.core.config import ConfigError
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.shard_check import check_shard


def test_an_unsharded_worker_never_writes_the_shard_marker(server: EmbeddedServer, redis: Redis) -> None:
    check_shard(redis, 0, 1, server.url)
    assert redis.exists(keys.SHARD_MARKER) == 0
    check_shard(redis, 0, 2, server.url)  # the first worker of shard 0 of 2 marks it
    assert redis.get(keys.SHARD_MARKER) == b"0/2"
    with pytest.raises(ConfigError, match="is shard 0/2"):
        check_shard(redis, 0, 1, server.url)  # an unsharded worker refuses a shard of several
