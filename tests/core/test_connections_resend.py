"""A client's ``resend`` (``connections.queue_client``): with it (the default, the schedulers'), a
command whose connection dropped while it ran is sent again on a new connection; without it (the
worker's), the connection error is raised and nothing is sent again, so that a step is run again
whole by its caller, on whatever server the URL names then."""

from __future__ import annotations

import threading
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from waits import wait_until

from sessionfork.core.config import Settings
from sessionfork.core.connections import queue_client
from sessionfork.embedded import EmbeddedServer


def _pop_while_dropped(client: Redis, killer: Redis) -> Any:
    """``client`` blocks in ``BLPOP``; its connection is killed while it blocks, then the list is
    given a value. Returns what the call ended with: its reply (a ``BLPOP`` sent again took the
    value) or its error."""
    ended: list[Any] = []

    def pop() -> None:
        try:
            ended.append(client.blpop(["wanted"], timeout=10))
        except RedisConnectionError as exc:
            ended.append(exc)

    thread = threading.Thread(target=pop, daemon=True)
    thread.start()
    wait_until(lambda: killer.info("clients")["blocked_clients"] == 1, 10, "the BLPOP to block")
    blocked = [c["id"] for c in killer.client_list() if c["cmd"] == "blpop"]
    assert len(blocked) == 1 and killer.execute_command("CLIENT", "KILL", "ID", blocked[0]) == 1
    wait_until(lambda: bool(ended) or killer.info("clients")["blocked_clients"] == 1, 10,
               "the call to fail or block again")
    killer.rpush("wanted", "v")
    thread.join(10)
    return ended[0]


def test_a_client_without_resend_raises_a_dropped_connection_and_sends_nothing_again(
        server: EmbeddedServer, redis: Redis) -> None:
    worker_side = queue_client(Settings(), server.url, resend=False)
    ended = _pop_while_dropped(worker_side, redis)
    assert isinstance(ended, RedisConnectionError), ended
    assert redis.llen("wanted") == 1  # not sent again: the value is left for the caller's own next try
    worker_side.close()


def test_a_client_with_resend_sends_the_command_again_on_a_new_connection(
        server: EmbeddedServer, redis: Redis) -> None:
    scheduler_side = queue_client(Settings(), server.url)
    ended = _pop_while_dropped(scheduler_side, redis)
    assert ended == (b"wanted", b"v")
    assert redis.llen("wanted") == 0
    scheduler_side.close()
