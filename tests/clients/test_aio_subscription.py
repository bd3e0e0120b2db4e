"""The asyncio client's reply subscription: pub/sub alone delivers; no reply missed before a
SUBSCRIBE is confirmed; a channel's state dropped once no waiter needs it; a dropped or
reconnecting subscription still answers every waiter."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import msgspec
from aio_helpers import client_for, run, source, until, workers
from helpers import SETTINGS
from redis import Redis
from waits import wait_until

from sessionfork import Registry
from sessionfork.aio import AsyncClient
from sessionfork.core import wire
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.outcomes import Outcomes


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
