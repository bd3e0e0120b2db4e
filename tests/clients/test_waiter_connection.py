"""A sync waiter costs the server little: the ``Client`` keeps one reply subscription across its
waits (confirmed before it enqueues, so a new request's outcome is read once, when its message
wakes the waiter), and ``wait_for_reply`` gives its connection back open, with no leftover message
for its next user (Redis CPU per fork, docs/performance.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import make_client, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis

from sessionfork.clients.client import Client
from sessionfork.clients.waiting import wait_for_reply
from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.outcomes import Outcomes


class CountingRedis(Redis):
    """A sync client counting its stored-outcome reads (``HMGET``)."""

    reads = 0

    def hmget(self, name: Any, keys_: Any, *args: Any) -> Any:  # type: ignore[override]
        CountingRedis.reads += 1
        return super().hmget(name, keys_, *args)


@pytest.fixture
def worker(server: EmbeddedServer, redis: Redis) -> Iterator[None]:
    Registry(redis).append(Registry(redis).create("wc-src"), turn(1))
    name = worker_name("wc")
    proc = start_worker(server.url, name)
    try:
        wait_registered(redis, name)
        yield
    finally:
        stop(proc)


@pytest.fixture
def client(worker: None, redis: Redis) -> Client:
    return make_client(redis)


def _connections(redis: Redis) -> int:
    return int(redis.info("stats")["total_connections_received"])


def _calls(redis: Redis, command: str) -> int:
    return int(redis.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_twenty_sync_waits_open_no_new_connection_and_leave_it_clean(client: Client, redis: Redis) -> None:
    assert client.fork("wc-src", session_id="wc-0", request_id="wc-r0", timeout=20).ok  # the pool's connections made
    before = _connections(redis)
    for i in range(1, 21):
        reply = client.fork("wc-src", session_id=f"wc-{i}", request_id=f"wc-r{i}", timeout=20)
        assert reply.ok and reply.request_id == f"wc-r{i}"
        # the connection the waiter holds is not the one plain commands use
        redis.set("wc-probe", str(i))
        assert redis.get("wc-probe") == str(i).encode()
    assert _connections(redis) - before <= 2  # was one new connection per wait


def test_twenty_waits_for_reply_give_the_connection_back_open_and_clean(client: Client, redis: Redis) -> None:
    client.close()
    first = client.request("wc-src", session_id="wf-0", request_id="wf-r0")
    client.submit(first)
    assert wait_for_reply(redis, "wf-r0", keys.DEFAULT_REPLY_CHANNEL, 20) is not None
    before = _connections(redis)
    for i in range(1, 21):
        client.submit(client.request("wc-src", session_id=f"wf-{i}", request_id=f"wf-r{i}"))
        reply = wait_for_reply(redis, f"wf-r{i}", keys.DEFAULT_REPLY_CHANNEL, 20)
        assert reply is not None and reply.ok and reply.request_id == f"wf-r{i}"
        redis.set("wf-probe", str(i))  # the released connection serves plain commands with their own replies
        assert redis.get("wf-probe") == str(i).encode()
    assert _connections(redis) - before <= 2  # was one new connection per wait
    assert redis.pubsub_numsub(keys.DEFAULT_REPLY_CHANNEL)[0][1] == 0  # nothing left subscribed


def test_a_client_keeps_one_subscription_and_reads_the_store_once_per_fork(worker: None, server: EmbeddedServer,
                                                                           redis: Redis) -> None:
    counting = CountingRedis.from_url(server.url)
    client = make_client(counting)
    client.recheck_every = 3600  # only a wake-up brings a read of the store
    try:
        assert client.fork("wc-src", session_id="ks-0", request_id="ks-r0", timeout=20).ok
        subscribes, unsubscribes = _calls(redis, "subscribe"), _calls(redis, "unsubscribe")
        CountingRedis.reads = 0
        for i in range(1, 11):
            assert client.fork("wc-src", session_id=f"ks-{i}", request_id=f"ks-r{i}", timeout=20).ok
        assert CountingRedis.reads == 10  # one read per fork: after its wake-up
        assert (_calls(redis, "subscribe"), _calls(redis, "unsubscribe")) == (subscribes, unsubscribes)
        assert redis.pubsub_numsub(keys.DEFAULT_REPLY_CHANNEL)[0][1] == 1  # kept between waits
        client.close()
        assert redis.pubsub_numsub(keys.DEFAULT_REPLY_CHANNEL)[0][1] == 0
    finally:
        counting.close()


class InstantOutcome(Client):
    """A client whose enqueue is followed at once by the request's outcome, as if a worker had
    answered before the enqueue's reply came back: a waiter that subscribed after enqueuing, and
    trusted the announcement, would never hear it."""

    def _submit(self, request: Any) -> tuple[str, int]:
        request_id, enqueued = super()._submit(request)
        failure = ForkFailure(request_id=request_id, code="SESSION_NOT_FOUND", message="gone")
        Outcomes(self.redis, ttl=60, stream_maxlen=100).record(failure, self.settings.reply_channel,
                                                              digest=wire.digest(request))
        return request_id, enqueued


def test_fork_subscribes_before_it_enqueues(redis: Redis) -> None:
    client = InstantOutcome(redis, make_client(redis).settings)
    client.recheck_every = 3600  # no periodic read of the store would rescue a missed announcement
    started = time.monotonic()
    reply = client.fork("nowhere", session_id="c", request_id="instant-1", timeout=30)
    assert isinstance(reply, ForkFailure) and reply.code == "SESSION_NOT_FOUND"
    assert time.monotonic() - started < 15  # woken by the announcement, not by the deadline's last look
    client.close()


def test_a_replayed_fork_reads_the_stored_outcome_at_once(client: Client) -> None:
    client.recheck_every = 3600  # a replay is announced to nobody: it must read the store at once
    first = client.fork("wc-src", session_id="rp-0", request_id="rp-r0", timeout=20)
    started = time.monotonic()
    again = client.fork("wc-src", session_id="rp-0", request_id="rp-r0", timeout=30)
    assert again == first
    assert time.monotonic() - started < 15  # read at once, not at the deadline's last look
    client.close()


def test_a_kept_subscription_dropped_between_forks_misses_no_reply(redis: Redis) -> None:
    """The reply is announced while the kept subscription is down (dropped between two forks,
    noticed only at the next read): the renewed subscription's confirmation makes the waiter read
    the store."""
    client = InstantOutcome(redis, make_client(redis).settings)
    client.recheck_every = 3600  # only a wake-up (a message, a renewed subscription) reads the store
    assert client.fork("nowhere", session_id="c", request_id="dr-r0", timeout=20).request_id == "dr-r0"
    ours = [c["id"] for c in redis.client_list(_type="pubsub")]
    assert len(ours) == 1
    redis.client_kill_filter(_id=ours[0])  # the kept subscription's connection
    started = time.monotonic()
    reply = client.fork("nowhere", session_id="c", request_id="dr-r1", timeout=30)
    assert isinstance(reply, ForkFailure) and reply.request_id == "dr-r1"
    assert time.monotonic() - started < 15  # not rescued by the deadline's last look
    client.close()
