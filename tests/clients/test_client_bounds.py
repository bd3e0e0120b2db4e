"""The clients' bounds. The asyncio client against a frozen server (SIGSTOP: connections
accepted, nothing answered): ``fork`` and ``wait`` raise ``TimeoutError`` by their deadline and
``submit`` within ``SUBMIT_RETRY_FOR``, whether the client comes from ``from_url`` (the settings'
socket time-outs) or wraps a ``redis.asyncio.Redis`` that has no time-outs at all. Both clients'
``from_url``/``from_urls`` give their connections the settings' time-outs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aio_helpers import until
from helpers import SETTINGS, make_client, registered_worker, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from waits import aoutcome_of, outcome_of

from sessionfork import Registry
from sessionfork.aio import AsyncClient
from sessionfork.client import Client as SyncClient
from sessionfork.core import wire
from sessionfork.core.config import Settings
from sessionfork.core.wire import ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol import requests
from sessionfork.worker.outcomes import Outcomes

pytestmark = pytest.mark.serial  # asserts time bounds: run alone (see pyproject's markers)

SLACK = requests.HARD_AFTER + 1.0  # seconds past a deadline: the hard cancellation, the loop's own delays


def took(call: Callable[[AsyncClient], Awaitable[object]], client: Callable[[], AsyncClient]) -> tuple[str, float]:
    """(the ``TimeoutError``'s message, seconds) of ``call`` on a new client; fails if it returns."""
    async def main() -> tuple[str, float]:
        async with client() as c:
            began = time.monotonic()
            with pytest.raises(TimeoutError) as raised:
                await call(c)
            return str(raised.value), time.monotonic() - began
    return asyncio.run(main())


def clients(server: EmbeddedServer) -> dict[str, Callable[[], AsyncClient]]:
    return {
        # from_url: each command bounded by the settings' socket_timeout (longer than the call here).
        "from_url": lambda: AsyncClient.from_url(server.url, Settings(socket_timeout=30, connect_timeout=30)),
        # A redis.asyncio client with no time-outs at all: only the call's own deadline bounds it.
        "no time-outs": lambda: AsyncClient(AsyncRedis.from_url(server.url, socket_timeout=None,
                                                                 socket_connect_timeout=None)),
    }


@pytest.mark.parametrize("kind", ["from_url", "no time-outs"])
def test_fork_raises_timeout_error_by_its_deadline(frozen: EmbeddedServer, kind: str) -> None:
    message, seconds = took(lambda c: c.fork("src", timeout=1.0, request_id="r-frozen"), clients(frozen)[kind])
    assert 1.0 <= seconds < 1.0 + SLACK, seconds
    assert message == "no reply to request r-frozen within 1.0s"


@pytest.mark.parametrize("kind", ["from_url", "no time-outs"])
def test_wait_raises_timeout_error_by_its_deadline(frozen: EmbeddedServer, kind: str) -> None:
    async def wait(c: AsyncClient) -> object:
        return await c.wait(await c.request("src", request_id="r-frozen-wait"), timeout=1.0)

    message, seconds = took(wait, clients(frozen)[kind])
    assert 1.0 <= seconds < 1.0 + SLACK, seconds
    assert message == "no reply to request r-frozen-wait within 1.0s"


@pytest.mark.parametrize("kind", ["from_url", "no time-outs"])
def test_submit_raises_timeout_error_within_its_retry_bound(frozen: EmbeddedServer, kind: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requests, "SUBMIT_RETRY_FOR", 1.0)

    async def submit(c: AsyncClient) -> object:
        return await c.submit(await c.request("src", request_id="r-frozen-submit"))

    message, seconds = took(submit, clients(frozen)[kind])
    assert 1.0 <= seconds < 1.0 + SLACK, seconds
    assert message == "request r-frozen-submit not enqueued within 1.0s"


def test_from_url_gives_commands_the_settings_time_outs(server: EmbeddedServer) -> None:
    """The default bounds of a from_url client's connections; a caller's own keyword wins."""
    settings = Settings(socket_timeout=7, connect_timeout=2)
    default = AsyncClient.from_url(server.url, settings).redis.connection_pool.connection_kwargs
    own = AsyncClient.from_urls([server.url], settings, socket_timeout=1).shards[0].connection_pool.connection_kwargs
    assert (default["socket_timeout"], default["socket_connect_timeout"]) == (7, 2)
    assert (own["socket_timeout"], own["socket_connect_timeout"]) == (1, 2)


def test_the_sync_clients_from_urls_gives_commands_the_settings_time_outs(server: EmbeddedServer) -> None:
    client = SyncClient.from_urls(server.url, Settings(socket_timeout=7, connect_timeout=2))
    try:
        kwargs = client.redis.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (7, 2)
    finally:
        client.close()
        client.redis.close()


def test_an_async_wait_of_0_answers_an_outcome_already_stored_as_the_sync_client(server: EmbeddedServer,
                                                                                redis: Redis) -> None:
    """A last read of the stored outcome comes before the deadline's TimeoutError, in both clients."""
    sync = make_client(redis)
    request = sync.request("src", session_id="child", request_id="r-stored")
    reply = ForkResult(request_id="r-stored", session=Header(version=0, id="child", created_at=1))
    Outcomes(redis, ttl=60, stream_maxlen=10).record(reply, SETTINGS.reply_channel, digest=wire.digest(request))
    assert outcome_of(lambda: sync.wait(request, 0)) == reply

    async def main() -> None:
        async with AsyncClient.from_url(server.url, SETTINGS) as client:
            assert await aoutcome_of(lambda: client.wait(request, 0)) == reply
            assert await aoutcome_of(lambda: client.wait(request, 0.001)) == reply

    asyncio.run(main())


def test_a_call_leaves_at_once_while_another_waiter_holds_the_subscription_lock(
        server: EmbeddedServer, registry: Registry) -> None:
    """Another holder of the subscription's lock (a waiter subscribing while the reader reconnects)
    holds it past the call's deadline: the reply read in time is the answer, returned at once, the
    channel unsubscribed at once on the client's side and on the server's once the lock is free."""
    held: list[bool] = []

    async def main() -> tuple[object, float, list[str]]:
        async with AsyncClient.from_url(server.url, SETTINGS) as client:
            router, enqueue = client.replies, client._enqueue_and_read
            release = asyncio.Event()

            async def hold() -> None:
                async with router._lock:
                    with contextlib.suppress(TimeoutError):  # bounded: a call that waits for it still ends
                        await asyncio.wait_for(release.wait(), 3)

            async def enqueue_then_hold(rid: str, call: Any) -> Any:
                asyncio.get_running_loop().create_task(hold())
                return await enqueue(rid, call)

            client._enqueue_and_read = enqueue_then_hold  # type: ignore[method-assign]
            began = time.monotonic()
            reply = await client.fork("src", timeout=1.0, session_id="child", request_id="r-leave")
            took, channels = time.monotonic() - began, client.replies.channels
            held.append(router._lock.locked())  # the race happened: the lock was held as the call left
            release.set()
            await until(lambda: client.replies.tracked == 0, 10, "the channel's state to go")
            await until(lambda: not router._strays, 10, "the UNSUBSCRIBE to go out")
            return reply, took, channels

    with registered_worker(server, "bounds"):  # (it flushes the server first)
        registry.append(registry.create("src"), turn(1))
        reply, seconds, channels = asyncio.run(main())
        with server.client() as probe:
            assert probe.pubsub_numsub(SETTINGS.reply_channel)[0][1] == 0
    assert isinstance(reply, ForkResult) and reply.session is not None and reply.session.id == "child", reply
    assert held == [True] and channels == [], (held, channels)
    assert seconds < 1.0, seconds  # did not wait for the lock


def test_a_waiter_ends_by_its_deadline_while_another_waits_for_a_frozen_server(frozen: EmbeddedServer) -> None:
    """Two calls on two channels from a client with no time-outs, the server frozen: the first
    (6 s) holds the subscription's lock opening the connection; the second (1 s) still raises
    TimeoutError by its deadline (plus HARD_AFTER), not at the first's."""
    async def main() -> tuple[float, float]:
        redis = AsyncRedis.from_url(frozen.url, socket_timeout=None, socket_connect_timeout=None)
        async with AsyncClient(redis) as client:
            async def timed(timeout: float, channel: str) -> float:
                began = time.monotonic()
                with pytest.raises(TimeoutError):
                    await client.fork("src", timeout=timeout, reply_to=channel)
                return time.monotonic() - began

            first = asyncio.create_task(timed(6.0, "sf:replies:a"))
            await until(client.replies._lock.locked, 5, "the first call to hold the lock")
            second = await timed(1.0, "sf:replies:b")
            return second, await first

    second, first = asyncio.run(main())
    assert 1.0 <= second < 1.0 + SLACK, second
    assert 6.0 <= first < 6.0 + SLACK, first


def test_a_fork_across_a_freeze_of_the_server_returns_its_child(caplog: pytest.LogCaptureFixture) -> None:
    """A from_url client whose socket_timeout (0.3 s) is far shorter than a 1.5 s freeze of the
    server: the enqueue's reply does not come in time, the enqueue is sent again (logged), and the
    fork returns its child once the server is back."""
    with EmbeddedServer() as srv, srv.client() as redis:
        Registry(redis).append(Registry(redis).create("src"), turn(1))
        name = worker_name("freeze")
        worker = start_worker(srv.url, name)
        try:
            wait_registered(redis, name)

            async def main() -> object:
                async with AsyncClient.from_url(srv.url, Settings(socket_timeout=0.3)) as client:
                    # A waiter that keeps the reply channel subscribed: the fork's enqueue is then the
                    # first command the freeze catches.
                    idle = asyncio.create_task(client.wait(await client.request("src", request_id="r-idle"), 60))
                    await until(lambda: client.replies.channels == [SETTINGS.reply_channel], 10, "the subscription")
                    assert srv.process is not None
                    srv.process.send_signal(signal.SIGSTOP)
                    thaw = threading.Timer(1.5, srv.process.send_signal, (signal.SIGCONT,))
                    thaw.start()
                    try:
                        return await client.fork("src", timeout=30, session_id="thawed", request_id="r-thawed")
                    finally:
                        thaw.join()
                        idle.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await idle

            with caplog.at_level(logging.INFO, logger="sessionfork.aio"):
                reply = asyncio.run(main())
        finally:
            assert srv.process is not None
            srv.process.send_signal(signal.SIGCONT)
            assert stop(worker) == 0
    assert isinstance(reply, ForkResult) and reply.session is not None and reply.session.id == "thawed", reply
    resent = [r.getMessage() for r in caplog.records if "sending it again" in r.getMessage()]
    assert any("Timeout" in message for message in resent), caplog.text  # the freeze caught a command


@pytest.mark.parametrize("call", ["fork", "wait"])
def test_a_cancelled_call_ends_at_once_even_when_its_command_swallows_the_cancellation(
        server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    """On Python 3.11, redis-py's ``asyncio.wait_for`` around a socket write can swallow
    a cancellation (a few of 1,000 cancelled calls then ran to their own deadline). Here the write
    of the call's outcome read (``fork``: the enqueue's pipeline; ``wait``: its HMGET) does not end
    and swallows the cancellation that reaches it: the cancelled call still ends with
    ``CancelledError`` at once, its waiter gone (its work runs in a task of its own), and that work
    is cancelled again until it ends: the client's socket time-out (30 s) is far beyond the 2 s the
    work is given to end, so only a second cancellation ends it."""
    from redis.asyncio.connection import AbstractConnection

    write = AbstractConnection._send_packed_command
    swallowed: list[float] = []
    events: dict[str, asyncio.Event] = {}

    async def stubborn_write(self: AbstractConnection, command: Any) -> None:
        joined = b"".join(bytes(part) if not isinstance(part, str) else part.encode() for part in command)
        if b"HMGET" in joined and "in write" in events and not swallowed:
            events["in write"].set()
            while True:
                try:
                    await asyncio.sleep(1)  # a write that does not end (a frozen server's), not a wait
                except asyncio.CancelledError:
                    if swallowed:
                        raise  # the next one (asyncio.run's, at the end)
                    swallowed.append(time.monotonic())
        await write(self, command)

    monkeypatch.setattr(AbstractConnection, "_send_packed_command", stubborn_write)

    def calls_work() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if not t.done() and any(
            part in t.get_coro().__qualname__ for part in ("._answer", ".work"))]  # type: ignore[union-attr]

    async def main() -> tuple[str, float, int]:
        async with AsyncClient.from_url(server.url, SETTINGS, socket_timeout=30) as client:
            request = await client.request("src", request_id=f"r-swallowed-{call}")
            events["in write"] = asyncio.Event()
            work = client.fork("src", timeout=5, request_id=request.request_id) if call == "fork" \
                else client.wait(request, 5)
            task = asyncio.ensure_future(work)
            await asyncio.wait_for(events["in write"].wait(), 5)
            assert len(calls_work()) == 1  # the call's work, in a task of its own
            began = time.monotonic()
            task.cancel()
            done, _ = await asyncio.wait((task,), timeout=3)
            how = "still running" if not done else "cancelled" if task.cancelled() else \
                type(task.exception()).__name__ if task.exception() else "returned"
            ended, waiters = time.monotonic() - began, client.replies.waiters
            if not done:
                return how, ended, waiters  # asserted below; asyncio.run cancels it again at its end
            deadline = time.monotonic() + 2
            while calls_work() and time.monotonic() < deadline:  # the abandoned work, cancelled again
                await asyncio.sleep(0.01)
            assert calls_work() == [], "the abandoned work still runs 2 s after the call ended"
            return how, ended, waiters

    how, seconds, waiters = asyncio.run(main())
    assert len(swallowed) == 1, swallowed  # the write swallowed a cancellation: the race this is about
    assert (how, waiters) == ("cancelled", 0), (how, waiters)
    assert seconds < 0.5, seconds


def test_thousands_of_cancelled_calls_each_end_at_their_cancellation(server: EmbeddedServer) -> None:
    """The swallowed cancellation at scale (2,000 calls, a load that loses a few cancellations
    on this project's 2-core machines): concurrent ``wait_for(fork(timeout=30), 1.5)`` with no
    worker each end with ``TimeoutError`` within 1 s of their cancellation at 1.5 s (a few ran to
    their 30 s deadline when redis-py's write swallowed their cancellation)."""
    async def main() -> list[tuple[str, float]]:
        async with AsyncClient.from_url(server.url, Settings()) as client:
            async def one(i: int) -> tuple[str, float]:
                began = time.monotonic()
                try:
                    await asyncio.wait_for(client.fork("src", timeout=30, request_id=f"r-many-{i}"), 1.5)
                except TimeoutError:
                    return "TimeoutError", time.monotonic() - began
                return "returned", time.monotonic() - began
            ended = await asyncio.gather(*(one(i) for i in range(2000)))
            assert client.replies.waiters == 0
            return ended

    ended = asyncio.run(main())
    assert {how for how, _ in ended} == {"TimeoutError"}
    late = sorted(seconds for _, seconds in ended if not 1.5 <= seconds < 2.5)
    assert not late, late



def sync_clients(server: EmbeddedServer) -> dict[str, Callable[[], SyncClient]]:
    return {
        # from_urls: each command bounded by the settings' socket_timeout (longer than the call here).
        "from_urls": lambda: SyncClient.from_urls(server.url, Settings(socket_timeout=30, connect_timeout=30)),
        # redis-py's own defaults: a timed-out command sent again 10 times, with back-off (measured:
        # a 1 s fork took 8-10 s with a 0.5 s socket_timeout).
        "redis-py retries": lambda: SyncClient(Redis(port=server.port, socket_timeout=0.5)),
        # No time-outs at all: only the call's own deadline bounds it.
        "no time-outs": lambda: SyncClient(Redis(port=server.port, socket_timeout=None, socket_connect_timeout=None)),
    }


SYNC_SLACK = requests.HARD_AFTER + 0.25  # the cut HARD_AFTER past the deadline, and a thread's hand-off


def sync_took(call: Callable[[SyncClient], object], client: SyncClient) -> tuple[str, float]:
    """(the ``TimeoutError``'s message, seconds) of ``call``; fails if it returns or raises another."""
    began = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        call(client)
    return str(raised.value), time.monotonic() - began


@pytest.mark.parametrize("call", ["fork", "wait"])
@pytest.mark.parametrize("kind", ["from_urls", "redis-py retries", "no time-outs"])
def test_the_sync_clients_calls_raise_timeout_error_by_their_deadline(frozen: EmbeddedServer, kind: str,
                                                                      call: str) -> None:
    """The sync client's ``fork`` and ``wait`` raise ``TimeoutError`` within
    ``HARD_AFTER`` of their deadline against a frozen server, whatever the ``Redis`` (its retries
    multiplied the socket time-out, or it has none); the cut call's listener is not this thread's
    any more (its work still holds it), so the next call subscribes anew."""
    client = sync_clients(frozen)[kind]()
    if call == "fork":
        message, seconds = sync_took(lambda c: c.fork("src", timeout=1.0, request_id="r-sync"), client)
    else:
        message, seconds = sync_took(lambda c: c.wait(c.request("src", request_id="r-sync"), 1.0), client)
    assert 1.0 <= seconds < 1.0 + SYNC_SLACK, seconds
    assert message == "no reply to request r-sync within 1.0s"
    assert client._local.__dict__.get("listeners") == {}
    assert "caller" not in client._local.__dict__  # its call thread is the cut work's: the next call takes another


def test_the_sync_clients_submit_raises_timeout_error_within_its_retry_bound(frozen: EmbeddedServer,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requests, "SUBMIT_RETRY_FOR", 1.0)
    client = sync_clients(frozen)["no time-outs"]()
    message, seconds = sync_took(lambda c: c.submit(c.request("src", request_id="r-sync-submit")), client)
    assert 1.0 <= seconds < 1.0 + SYNC_SLACK, seconds
    assert message == "request r-sync-submit not enqueued within 1.0s"
    assert "caller" not in client._local.__dict__  # its call thread is the cut work's: the next call takes another
