"""A sync waiter gives its connection back open: no new connection per wait (Redis CPU per fork,
docs/performance.md), and the pooled connection carries no leftover message to its next user."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import make_client, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis

from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.queue.client import Client


@pytest.fixture
def client(server: EmbeddedServer, redis: Redis) -> Iterator[Client]:
    Registry(redis).append(Registry(redis).create("wc-src"), turn(1))
    name = worker_name("wc")
    proc = start_worker(server.url, name)
    try:
        wait_registered(redis, name)
        yield make_client(redis)
    finally:
        stop(proc)


def _connections(redis: Redis) -> int:
    return int(redis.info("stats")["total_connections_received"])


def test_twenty_sync_waits_open_no_new_connection_and_leave_it_clean(client: Client, redis: Redis) -> None:
    assert client.fork("wc-src", session_id="wc-0", request_id="wc-r0", timeout=20).ok  # the pool's connections made
    before = _connections(redis)
    for i in range(1, 21):
        reply = client.fork("wc-src", session_id=f"wc-{i}", request_id=f"wc-r{i}", timeout=20)
        assert reply.ok and reply.request_id == f"wc-r{i}"
        # the connection the waiter released serves plain commands with their own replies
        redis.set("wc-probe", str(i))
        assert redis.get("wc-probe") == str(i).encode()
    assert _connections(redis) - before <= 2  # was one new connection per wait
