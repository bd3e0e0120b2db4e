"""The asyncio client against a real worker process: fork, submit, wait, idempotency and conflict as
the sync client's; a waiter that times out or is cancelled leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest
from aio_helpers import client_for, run, source, until, workers
from redis import Redis

from sessionfork import NewEvent, Registry
from sessionfork.core import wire
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol import rq_layout

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
            # By its id alone (a request submitted elsewhere): its outcome, no conflict to tell.
            assert isinstance(request.request_id, str)
            assert await late.wait(request.request_id, timeout=5) == fan
            assert await late.wait("aio-1", timeout=5) == reply  # whatever request it was

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
