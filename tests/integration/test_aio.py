"""The asyncio client (``sessionfork.aio.AsyncClient``) against real worker processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
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


def test_a_thousand_concurrent_forks_over_at_most_four_connections(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    sid = source(registry, "aio-many")
    seen: list[int] = []
    stop_sampling = threading.Event()

    def ours() -> int:
        return sum(1 for c in redis.client_list() if c.get("name") == "sf-aio-test")

    def sample() -> None:
        while not stop_sampling.is_set():
            seen.append(ours())
            stop_sampling.wait(0.02)

    async def main() -> list[ForkResult | ForkFailure]:
        async with client_for(server, client_name="sf-aio-test") as client:
            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                return await asyncio.gather(*(client.fork(sid, timeout=120) for _ in range(1000)))
            finally:
                stop_sampling.set()
                sampler.join()

    with workers(server, redis, 4):
        replies = asyncio.run(main())
    assert all(isinstance(r, ForkResult) for r in replies), [r for r in replies if not r.ok][:3]
    children = {r.session.id for r in replies if isinstance(r, ForkResult) and r.session}
    assert len(children) == 1000 and len({r.request_id for r in replies}) == 1000
    assert set(registry.children(sid)) == children
    assert max(seen) >= 2 and max(seen) <= 4, max(seen)
    wait_until(lambda: ours() == 0, 5, "the client's connections to close")


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
            second = await client.request("s", request_id="drop-2")
            task = asyncio.create_task(client.wait(second, timeout=20))
            await until(lambda: redis.pubsub_numsub(channel)[0][1] == 1, 10, "a new subscription")
            later = ForkFailure(request_id="drop-2", code="SESSION_NOT_FOUND", message='session "s" not found')
            outcomes.record(later, channel, digest=wire.digest(second))
            assert await task == later

    run(main)
