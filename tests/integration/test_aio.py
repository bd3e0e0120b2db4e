"""The asyncio client (``sessionfork.aio.AsyncClient``) against real worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from helpers import SETTINGS, make_client, start_worker, stop, wait_registered, worker_name
from redis import Redis
from rq.job import Job

from sessionfork import NewEvent, Registry
from sessionfork.aio import AsyncClient
from sessionfork.core import wire
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.queue import jobs
from sessionfork.queue.outcomes import Outcomes
from sessionfork.queue.rq_seam import layout as rq_layout


@contextmanager
def workers(server: EmbeddedServer, redis: Redis, n: int) -> Iterator[None]:
    procs = []
    try:
        for _ in range(n):
            name = worker_name("aio")
            procs.append(start_worker(server.url, name))
            wait_registered(redis, name)
        yield
    finally:
        for proc in procs:
            assert stop(proc) == 0


def source(registry: Registry, sid: str = "aio-src") -> str:
    handle = registry.create(sid)
    registry.append(handle, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    return sid


def client_for(server: EmbeddedServer, **kwargs: object) -> AsyncClient:
    return AsyncClient.from_url(server.url, SETTINGS, **kwargs)


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait on the event loop for ``predicate`` with a deadline (a condition, not a sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


async def answered_on_a_new_subscription(client: AsyncClient, redis: Redis, outcomes: Outcomes, request_id: str,
                                         timeout: float, subscribed_within: float) -> None:
    """A wait for ``request_id`` (its ``timeout``) subscribes again, seen by the server within
    ``subscribed_within`` seconds, and the outcome recorded then answers it."""
    channel = client.settings.reply_channel
    request = await client.request("s", request_id=request_id)
    task = asyncio.create_task(client.wait(request, timeout=timeout))
    await until(lambda: redis.pubsub_numsub(channel)[0][1] == 1, subscribed_within, "a new subscription")
    reply = ForkFailure(request_id=request_id, code="SESSION_NOT_FOUND", message='session "s" not found')
    outcomes.record(reply, channel, digest=wire.digest(request))
    assert await task == reply


# -- the job hash -------------------------------------------------------------------------------


def test_job_hash_is_field_by_field_what_rq_writes(server: EmbeddedServer, redis: Redis) -> None:
    payload_source = {"requestId": "hash-1", "source": "s" * 200}  # long: RQ truncates the description
    sync = make_client(redis)
    request = sync.request(payload_source["source"], request_id="hash-1", session_id="child-x")
    assert jobs.enqueue(jobs.make_queue(redis, SETTINGS), wire.encode(request), "hash-1", SETTINGS)  # RQ's own
    by_rq = redis.hgetall(rq_layout.job_key("hash-1"))
    queue_by_rq = redis.lrange(rq_layout.queue_key(SETTINGS.queue), 0, -1)
    queues_by_rq = redis.smembers(rq_layout.QUEUES)
    redis.flushall()

    async def main() -> None:
        async with client_for(server) as client:
            assert await client.submit(request) == "hash-1"
            assert await client.submit(request) == "hash-1"  # a second submit is a no-op

    run(main)
    ours = redis.hgetall(rq_layout.job_key("hash-1"))
    assert set(ours) == {*by_rq, b"sf_identity"}  # and the request's identity, for the enqueue script
    for name in by_rq:
        if name in (b"created_at", b"enqueued_at"):
            assert len(ours[name]) == len(by_rq[name]) and ours[name].endswith(b"Z")
        else:
            assert ours[name] == by_rq[name], name
    assert redis.lrange(rq_layout.queue_key(SETTINGS.queue), 0, -1) == queue_by_rq == [b"hash-1"]
    assert redis.smembers(rq_layout.QUEUES) == queues_by_rq
    redis.delete(rq_layout.job_key("hash-1"), rq_layout.queue_key(SETTINGS.queue))
    sync.submit(request)  # the sync client writes the same hash (one function: rq_layout.job_fields)
    assert {k: v for k, v in redis.hgetall(rq_layout.job_key("hash-1")).items()
            if k not in (b"created_at", b"enqueued_at")} == {k: v for k, v in ours.items()
                                                             if k not in (b"created_at", b"enqueued_at")}
    job = Job.fetch("hash-1", connection=redis, serializer=jobs.JSONSerializer)
    assert job.func_name == jobs.JOB_FUNCTION and job.get_status() == "queued"
    assert wire.decode_request(job.args[0]) == request


def test_rq_key_names_are_rqs_own(redis: Redis) -> None:
    queue = jobs.make_queue(redis, SETTINGS)
    patterns = rq_layout.key_patterns(queue.name)
    assert rq_layout.job_key("r-1") == wire.text(Job.key_for("r-1")) == patterns["jobs"][:-1] + "r-1"
    assert rq_layout.queue_key(queue.name) == queue.key == rq_layout.key_patterns(queue.name)["queue"]
    assert rq_layout.QUEUES == queue.redis_queues_keys == rq_layout.key_patterns(queue.name)["queues"]


def test_importing_the_async_client_imports_no_rq() -> None:
    code = "import sys, sessionfork.aio; print(sorted(m for m in sys.modules if m.split('.')[0] == 'rq'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- semantics ------------------------------------------------------------------------------------


def test_fork_submit_wait_idempotency_and_conflict(server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    sid = source(registry)

    async def main() -> None:
        async with client_for(server) as client:
            reply = await client.fork(sid, session_id="aio-child", request_id="aio-1", timeout=20)
            assert isinstance(reply, ForkResult) and reply.session.id == "aio-child"  # type: ignore[union-attr]
            again = await client.fork(sid, session_id="aio-child", request_id="aio-1", timeout=20)
            assert again == reply  # the same request id answers the first outcome
            other = await client.fork(sid, session_id="aio-other", request_id="aio-1", timeout=20)
            assert isinstance(other, ForkFailure) and other.code == "IDEMPOTENCY_CONFLICT"
            request = await client.request(sid, count=3)
            await client.submit(request)
            await client.submit(request)
            fan = await client.wait(request, timeout=20)
            assert isinstance(fan, ForkResult) and len(fan.sessions or []) == 3
            busy = registry.create("aio-busy")
            registry.append(busy, [NewEvent("turn/start", {"turn": 1})])
            failed = await client.fork("aio-busy", timeout=20)
            assert isinstance(failed, ForkFailure) and failed.code == "OPEN_TURN"
        # A late waiter on a fresh client (nothing is published any more) reads the stored outcome.
        async with client_for(server) as late:
            assert await late.wait(request, timeout=5) == fan

    with workers(server, redis, 1):
        run(main)
    assert registry.children(sid) == sorted(["aio-child", *(h.id for h in fan_children(redis, sid))])


def fan_children(redis: Redis, sid: str) -> list[wire.Header]:
    reg = Registry(redis)
    return [reg.header(c) for c in reg.children(sid) if c != "aio-child"]


def test_timeout_and_cancelled_waiters_leave_nothing_behind(server: EmbeddedServer, redis: Redis) -> None:
    async def main() -> None:
        async with client_for(server) as client:
            request = await client.request("nobody", request_id="never-submitted", reply_to="sf:replies:aio")
            with pytest.raises(TimeoutError):
                await client.wait(request, timeout=0.3)
            assert client.replies.waiters == 0 and client.replies.channels == []
            task = asyncio.create_task(client.wait(request, timeout=30))
            await until(lambda: client.replies.channels == ["sf:replies:aio"], 5, "the waiter to subscribe")
            assert client.replies.waiters == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert client.replies.waiters == 0 and client.replies.channels == []
            await until(lambda: redis.pubsub_numsub("sf:replies:aio") == [(b"sf:replies:aio", 0)], 5,
                        "the channel to have no subscriber")

    run(main)
    assert redis.exists(rq_layout.job_key("never-submitted")) == 0


def local_addresses() -> set[str]:
    """``ip:port`` of every TCP socket this process holds open (Linux ``/proc``): what the server's
    ``CLIENT LIST`` shows as ``addr`` for this process's connections, whatever their names."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    found = set()
    for table, family in (("/proc/self/net/tcp", socket.AF_INET), ("/proc/self/net/tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[9] in inodes:
                    ip_hex, port_hex = fields[1].split(":")
                    raw = bytes.fromhex(ip_hex)
                    # /proc prints each 32-bit word of the address in host (little-endian) order.
                    ip = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    text = socket.inet_ntop(family, ip)
                    found.add(f"{text.removeprefix('::ffff:')}:{int(port_hex, 16)}")
    return found


class Connections:
    """The server's view of the connections this process opened after it was made: counted by the
    process's socket addresses (``CLIENT LIST addr``), never by client name."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.probe = Redis.from_url(server.url, single_connection_client=True)
        self.probe.ping()
        self.before = local_addresses()  # this test's own connections (fixtures, the probe)

    def current(self) -> list[dict[str, Any]]:
        ours = local_addresses() - self.before
        return [c for c in self.probe.client_list() if c["addr"] in ours]

    def close(self) -> None:
        self.probe.close()


def test_a_thousand_concurrent_forks_over_at_most_four_connections(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    """Counted by the process's addresses: a client opening a connection of its own for some
    command (named or not) shows up here."""
    sid = source(registry, "aio-many")
    conns = Connections(server)
    seen: list[int] = []
    ids: set[str] = set()
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.is_set():
            now = conns.current()
            seen.append(len(now))
            ids.update(c["id"] for c in now)
            stop_sampling.wait(0.01)

    async def main() -> list[ForkResult | ForkFailure]:
        async with client_for(server) as client:
            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                return await asyncio.gather(*(client.fork(sid, timeout=120) for _ in range(1000)))
            finally:
                stop_sampling.set()
                sampler.join()

    try:
        with workers(server, redis, 4):
            replies = asyncio.run(main())
        assert all(isinstance(r, ForkResult) for r in replies), [r for r in replies if not r.ok][:3]
        children = {r.session.id for r in replies if isinstance(r, ForkResult) and r.session}
        assert len(children) == 1000 and len({r.request_id for r in replies}) == 1000
        assert set(registry.children(sid)) == children
        assert max(seen) >= 2 and max(seen) <= 4, max(seen)
        assert len(ids) <= 4, ids  # the same connections all along: none opened per command
        wait_until(lambda: conns.current() == [], 5, "the client's connections to close")
    finally:
        conns.close()


def test_every_fork_gets_its_outcome_while_its_connections_are_killed(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    """CLIENT KILL of every connection of the client (commands and subscription), five times while
    300 forks run, half of them on reply channels of their own (SUBSCRIBEs all along): each call
    still returns its own child (a command whose reply was lost is sent again)."""
    sid = source(registry, "aio-kill")
    conns = Connections(server)
    done: list[Any] = []
    landed: list[tuple[int, int]] = []  # (replies in before the kill, connections killed)

    def killer() -> None:
        for threshold in (20, 80, 140, 200, 260):
            wait_until(lambda t=threshold: len(done) >= t, 120, f"{threshold} replies")
            before = len(done)
            killed = sum(conns.probe.client_kill_filter(_id=c["id"]) for c in conns.current())
            landed.append((before, killed))

    async def main() -> list[Any]:
        async with client_for(server) as client:
            async def one(i: int) -> Any:
                reply = await client.fork(sid, timeout=120, reply_to=f"sf:replies:kill-{i}" if i % 2 else None)
                done.append(reply)
                return reply

            thread = threading.Thread(target=killer)
            thread.start()
            try:
                return await asyncio.gather(*(one(i) for i in range(300)), return_exceptions=True)
            finally:
                thread.join(130)

    try:
        with workers(server, redis, 2):
            replies = asyncio.run(main())
    finally:
        conns.close()
    errors = [r for r in replies if not isinstance(r, ForkResult)]
    assert errors == [], errors[:3]
    # The kills landed mid-run: each with replies still to come, each killing connections in use.
    assert len(landed) == 5 and all(0 < before < 300 and killed >= 1 for before, killed in landed), landed
    children = {r.session.id for r in replies if isinstance(r, ForkResult) and r.session}
    assert len(children) == 300 and set(registry.children(sid)) == children


def test_pub_sub_alone_delivers_with_rechecks_far_apart(server: EmbeddedServer, redis: Redis,
                                                        registry: Registry) -> None:
    """``recheck_every`` far above the deadline: every reply must come by its pub/sub wake-up."""
    sid = source(registry, "aio-pubsub")

    async def main() -> list[Any]:
        async with client_for(server, recheck_every=3600) as client:
            return await asyncio.gather(*(client.fork(sid, timeout=DEADLINE) for _ in range(20)))

    DEADLINE = 20.0
    with workers(server, redis, 1):
        started = time.monotonic()
        replies = asyncio.run(main())
        elapsed = time.monotonic() - started
    assert all(isinstance(r, ForkResult) for r in replies), replies[:3]
    # Long before the deadline (where a waiter reads the store one last time): woken by pub/sub.
    assert elapsed < DEADLINE / 2, elapsed


def test_a_reply_recorded_before_the_subscription_is_confirmed_is_not_missed(
        server: EmbeddedServer, redis: Redis) -> None:
    """The server runs the waiter's SUBSCRIBE only after the reply is recorded and published (to
    nobody): the waiter must not read the store before the confirmation, and must then find it."""
    outcomes = Outcomes(redis, ttl=60, stream_maxlen=100)
    tag = uuid.uuid4().hex[:8]
    channel = f"sf:replies:late-{tag}"
    reply = ForkFailure(request_id=f"late-{tag}", code="SESSION_NOT_FOUND", message='session "s" not found')
    reads_before_record: list[int] = []

    async def main() -> None:
        async with client_for(server, recheck_every=3600) as client:
            # Another waiter keeps the subscription connection (and its reader) up.
            keep = asyncio.create_task(client.wait(await client.request("s", request_id=f"keep-{tag}"), timeout=60))
            await until(lambda: client.replies.channels == [SETTINGS.reply_channel], 10, "the first subscription")
            await asyncio.to_thread(wait_until, lambda: redis.pubsub_numsub(SETTINGS.reply_channel)[0][1] == 1, 10,
                                    "the server to run it")
            reads = [0]
            real_hmget = client.redis.hmget

            async def hmget(name: Any, *args: Any, **kwargs: Any) -> Any:
                result = await real_hmget(name, *args, **kwargs)
                reads[0] += wire.text(name).endswith(reply.request_id)
                return result

            client.redis.hmget = hmget  # type: ignore[method-assign]
            router = client.replies
            real_send = router._send
            later: list[asyncio.Task[None]] = []

            async def send_later(command: str, name: str) -> None:
                # A waiter that does not wait for the confirmation reads the store at once; one
                # that does never reads before the SUBSCRIBE sent below is confirmed, so this waits
                # for a read that must not come (bounded: a second, then the test goes on).
                with contextlib.suppress(AssertionError):
                    await until(lambda: reads[0] >= 1, 1.0, "a read before the confirmation")
                reads_before_record.append(reads[0])
                assert redis.pubsub_numsub(channel) == [(channel.encode(), 0)]
                outcomes.record(reply, channel, digest=wire.digest(request))  # published to nobody
                await real_send(command, name)

            async def send(command: str, name: str) -> None:
                if command == "SUBSCRIBE" and name == channel:  # the server runs it later
                    later.append(asyncio.create_task(send_later(command, name)))
                else:
                    await real_send(command, name)

            router._send = send  # type: ignore[method-assign]
            request = await client.request("s", request_id=reply.request_id, reply_to=channel)
            answer = await client.wait(request, timeout=8)
            assert answer == reply
            await later[0]
            keep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keep

    run(main)
    assert reads_before_record == [0]  # the store was read only once the SUBSCRIBE was confirmed


def test_channel_state_is_dropped_when_no_waiter_needs_it(server: EmbeddedServer) -> None:
    """2,000 waits on distinct reply channels: the router keeps no state for any of them after."""
    async def main() -> None:
        async with client_for(server) as client:
            for batch in range(20):
                waits = []
                for i in range(100):
                    request = await client.request("s", request_id=f"ch-{batch}-{i}",
                                                   reply_to=f"sf:replies:ch-{batch}-{i}")
                    waits.append(client.wait(request, timeout=0.2))
                results = await asyncio.gather(*waits, return_exceptions=True)
                assert all(isinstance(r, TimeoutError) for r in results), results[:3]
                assert client.replies.tracked <= 100
            await until(lambda: client.replies.tracked == 0 and client.replies.channels == [], 10,
                        "the router to drop every channel's state")
            assert client.replies.waiters == 0
            assert client.replies._pubsub.channels == {}  # redis-py's own record of them too

    run(main)


def test_a_waiter_survives_a_dropped_subscription(server: EmbeddedServer, redis: Redis) -> None:
    """The reply subscription's connection is killed: the waiter still gets its reply (the
    subscription is renewed, and the stored outcome read again), and the client keeps working."""
    outcomes = Outcomes(redis, ttl=60, stream_maxlen=100)
    # A channel of its own: no other test's subscriber can make the counts below ambiguous.
    settings = msgspec.structs.replace(SETTINGS, reply_channel=f"sf:replies:drop-{uuid.uuid4().hex[:8]}")
    channel = settings.reply_channel

    async def main() -> None:
        async with AsyncClient.from_url(server.url, settings, recheck_every=0.5) as client:
            first = await client.request("s", request_id="drop-1")
            task = asyncio.create_task(client.wait(first, timeout=20))
            await until(lambda: client.replies.channels == [channel], 5, "the subscription")
            await until(lambda: redis.pubsub_numsub(channel)[0][1] == 1, 5, "the server to see it")
            assert redis.client_kill_filter(_type="pubsub") >= 1
            reply = ForkFailure(request_id="drop-1", code="SESSION_NOT_FOUND", message='session "s" not found')
            outcomes.record(reply, channel, digest=wire.digest(first))
            assert await task == reply
            await until(lambda: redis.pubsub_numsub(channel)[0][1] == 0, 5, "the unsubscribe")
            await answered_on_a_new_subscription(client, redis, outcomes, "drop-2", 20, 10)

    run(main)


def test_a_channel_left_while_the_subscription_reconnects_is_subscribed_again_by_the_next_waiter(
        server: EmbeddedServer, redis: Redis) -> None:
    """The last waiter of a channel leaves while the reader is reconnecting (held down here): the
    renewal still comes, is dropped again, and the next waiter's subscription is confirmed (a
    confirmation counted for a renewal that never came would keep that waiter waiting forever)."""
    outcomes = Outcomes(redis, ttl=60, stream_maxlen=100)
    settings = msgspec.structs.replace(SETTINGS, reply_channel=f"sf:replies:left-{uuid.uuid4().hex[:8]}")
    channel = settings.reply_channel

    async def main() -> None:
        async with AsyncClient.from_url(server.url, settings, recheck_every=0.2) as client:
            router = client.replies
            first = await client.request("s", request_id="left-1")
            task = asyncio.create_task(client.wait(first, timeout=20))
            await until(lambda: redis.pubsub_numsub(channel)[0][1] == 1, 5, "the subscription")
            gate = asyncio.Event()
            connect = router._pubsub.connect

            async def held_connect() -> None:
                await gate.wait()
                await connect()

            router._pubsub.connect = held_connect
            assert redis.client_kill_filter(_type="pubsub") >= 1
            await until(lambda: not router._up.is_set(), 5, "the reader to see the drop")
            reply = ForkFailure(request_id="left-1", code="SESSION_NOT_FOUND", message='session "s" not found')
            outcomes.record(reply, channel, digest=wire.digest(first))
            assert await task == reply  # read on a recheck, the subscription still down
            assert router.waiters == 0 and not router._up.is_set(), "the waiter left while the reader was down"
            gate.set()
            await until(lambda: router._up.is_set(), 5, "the reconnection")
            await until(lambda: router.tracked == 0 and redis.pubsub_numsub(channel)[0][1] == 0, 5,
                        "the renewal to be dropped again")
            await answered_on_a_new_subscription(client, redis, outcomes, "left-2", 10, 5)

    run(main)
