"""The asyncio scheduler client: submit fork requests and await their replies on ``redis.asyncio``.

    async with AsyncClient.from_url("redis://localhost:6379/0") as client:
        reply = await client.fork("sess-a", session_id="child-1", timeout=5)

Same semantics as the sync ``clients.client.Client``: a request id makes a submission idempotent
(submitting it again, or waiting again after a time-out, never forks twice and answers the first
outcome), a request id reused for a different request answers ``IDEMPOTENCY_CONFLICT``, and
``wait`` raises ``TimeoutError`` when no reply comes in time.

RQ has no asyncio API: a request is enqueued by ``scripts/enqueue.lua`` (the README's any-language
recipe; ``FCALL sf_enqueue`` when its library is loaded, see ``protocol.enqueue``) with the job hash
RQ's own enqueue writes (``protocol.rq_layout``). Importing this module imports no RQ.

One subscription per client (``ReplyRouter``) serves every waiter: a message wakes the waiters of
the request id it names, and the answer is the stored outcome read then (a message is never the
answer: anyone may publish on a channel). A waiter registers, waits until the subscription to its
reply channel is confirmed, then reads the stored outcome, so a reply published before it listened
is never lost; the stored outcome is read again every ``recheck_every`` seconds without news (for
a reply announced on another channel). A command whose reply is lost to a dropped connection (the
enqueue, an outcome read) is sent again until the call's deadline: each is idempotent. A waiter
that returns, times out or is cancelled removes itself, and the client unsubscribes from a channel
no waiter needs any more.

Connections: the subscription has one connection of its own (same server and options as
``redis``'s pool) for the client's life; commands share ``redis``'s pool.
``AsyncClient.from_url(url, max_connections=4)`` never opens more than 4 (3 for commands).

Bounds: ``fork`` and ``wait`` return or raise ``TimeoutError`` at their deadline (after a last
read of the stored outcome, as the sync client's), and ``submit`` within ``requests.SUBMIT_RETRY_FOR``
seconds, whatever the server does (a frozen one included) and whatever client ``redis`` is: a
call's Redis work runs in a task of its own, left (and cancelled until it ends) ``requests.HARD_AFTER``
seconds past the deadline, or at once when the call is cancelled. ``from_url`` and
``from_urls`` give each command the settings' ``socket_timeout`` and each connection their
``connect_timeout`` (a command whose reply does not come in time is sent again, until the deadline).

A sharded queue: give one ``redis`` per queue server, in shard order (``AsyncClient([r0, r1])`` or
``AsyncClient.from_urls([...])``); a request is enqueued and awaited on the shard
``shards.shard_of(request_id, n)`` names. Each shard has its own subscription (opened when a
waiter first needs it) and its own pool; ``max_connections`` bounds each shard's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar, Unpack, cast, overload

from redis.asyncio import Redis

from ..core import connections, errors, keys, wire
from ..core.config import Settings, split_urls
from ..core.factories import new_request_id
from ..core.outages import is_lost
from ..core.wire import (
    AnyRequest,
    ForkRequest,
    LiveHandle,
    MergeReply,
    MergeRequest,
    Outcome,
    Reply,
    SelectReply,
    SelectRequest,
)
from ..protocol import merge_requests, outcomes, requests, shards, tracing
from ..protocol.enqueue import AsyncEnqueuer, job_call
from ..protocol.merge_requests import ClientMergeOptions
from ..protocol.outcomes import OUTCOME_FIELDS, verdict
from ..protocol.requests import ForkOptions
from .subscriptions import ReplyRouter

T = TypeVar("T")
R = TypeVar("R", bound=AnyRequest)
log = logging.getLogger("sessionfork.aio")


class AsyncClient:
    """A scheduler's asyncio handle on the fork queue (``redis`` is the queue server).

    All of ``request``, ``submit``, ``wait`` and ``fork`` are coroutines (``request`` does no I/O).
    """

    def __init__(self, redis: Redis | Sequence[Redis], settings: Settings | None = None, *,
                 new_id: Callable[[], str] = new_request_id, recheck_every: float = 1.0) -> None:
        self.shards = [redis] if isinstance(redis, Redis) else list(redis)
        if not self.shards:
            raise ValueError("an AsyncClient needs at least one queue server")
        self.settings = settings or Settings()
        self.routers = [ReplyRouter(shard) for shard in self.shards]
        self.redis, self.replies = self.shards[0], self.routers[0]
        self.recheck_every = recheck_every
        self._new_id = new_id
        self._enqueuers = [AsyncEnqueuer(shard, self.settings) for shard in self.shards]

    @classmethod
    def from_url(cls, url: str, settings: Settings | None = None, *, max_connections: int = 4,
                 new_id: Callable[[], str] = new_request_id, recheck_every: float = 1.0,
                 **connection_kwargs: Any) -> AsyncClient:
        """A client that never holds more than ``max_connections`` connections (2 at least: the
        subscription and one for commands); ``connection_kwargs`` go to the connection pool. A
        ``redis+sentinel://`` URL follows its primary's promotions."""
        bounded = _bounded(settings or Settings(), connection_kwargs)
        pool = connections.async_pool(url, max_connections=max(max_connections - 1, 1), **bounded)
        return cls(Redis.from_pool(pool), settings, new_id=new_id, recheck_every=recheck_every)

    @classmethod
    def from_urls(cls, urls: str | Sequence[str], settings: Settings | None = None, *, max_connections: int = 4,
                  new_id: Callable[[], str] = new_request_id, recheck_every: float = 1.0,
                  **connection_kwargs: Any) -> AsyncClient:
        """A client of the queue servers at ``urls`` (a list, or one comma-separated string split by
        ``config.split_urls``: a Sentinel URL's hosts stay together), in shard order;
        ``max_connections`` and ``connection_kwargs`` apply to each shard as in ``from_url``."""
        listed = split_urls(urls, "urls") if isinstance(urls, str) else list(urls)
        bounded = _bounded(settings or Settings(), connection_kwargs)
        pools = [connections.async_pool(url.strip(), max_connections=max(max_connections - 1, 1),
                                        **bounded) for url in listed]
        return cls([Redis.from_pool(pool) for pool in pools], settings, new_id=new_id, recheck_every=recheck_every)

    def shard_of(self, request_id: str) -> int:
        """The shard (index into ``shards``) that holds ``request_id``."""
        return shards.shard_of(request_id, len(self.shards))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Drop the subscriptions and close the connections."""
        for router, redis in zip(self.routers, self.shards, strict=True):
            await router.aclose()
            await redis.aclose()

    async def request(self, source: str | LiveHandle, **options: Unpack[ForkOptions]) -> ForkRequest:
        """Build a request (no I/O) forking ``source`` with ``options`` (``ForkOptions``), as
        ``Client.request``: a generated request id when none is given, ``TypeError`` for an unknown
        option, ``INVALID_REQUEST`` for a bad one. With OpenTelemetry installed, it carries the
        current trace context (``traceparent``)."""
        return self._build(source, options, "AsyncClient.request")

    def _build(self, source: str | LiveHandle, options: ForkOptions, where: str) -> ForkRequest:
        return requests.build(source, options, self._new_id, traceparent=tracing.current_traceparent(), where=where)

    async def merge_request(self, parent: str | LiveHandle, child: str,
                            **options: Unpack[ClientMergeOptions]) -> MergeRequest:
        """Build a merge request (no I/O), as ``Client.merge_request``."""
        request = merge_requests.build("merge", parent, options, self._new_id, child=child,
                                       traceparent=tracing.current_traceparent())
        assert isinstance(request, MergeRequest)
        return request

    async def select_request(self, parent: str | LiveHandle, candidates: Sequence[str], winner: str,
                             **options: Unpack[ClientMergeOptions]) -> SelectRequest:
        """Build a select request (no I/O), as ``Client.select_request``."""
        request = merge_requests.build("select", parent, options, self._new_id, child=winner, candidates=candidates,
                                       traceparent=tracing.current_traceparent())
        assert isinstance(request, SelectRequest)
        return request

    async def merge(self, parent: str | LiveHandle, child: str, *, timeout: float = 10.0,
                    **options: Unpack[ClientMergeOptions]) -> MergeReply:
        """Submit a merge request and await its reply within ``timeout`` seconds, as ``Client.merge``."""
        request = await self.merge_request(parent, child, **options)
        return cast(MergeReply, await self.run_request(request, timeout))

    async def select(self, parent: str | LiveHandle, candidates: Sequence[str], winner: str, *,
                     timeout: float = 10.0, **options: Unpack[ClientMergeOptions]) -> SelectReply:
        """Submit a select request and await its reply within ``timeout`` seconds, as ``Client.select``."""
        request = await self.select_request(parent, candidates, winner, **options)
        return cast(SelectReply, await self.run_request(request, timeout))

    async def submit(self, request: AnyRequest) -> str:
        """Enqueue ``request``; returns its request id. Enqueuing an id already queued is a no-op.
        Sent again for up to ``requests.SUBMIT_RETRY_FOR`` seconds while its reply is lost."""
        request, call = self._job(request)
        assert isinstance(request.request_id, str)
        limit = requests.SUBMIT_RETRY_FOR
        deadline = asyncio.get_running_loop().time() + limit
        enqueue = self._enqueuers[self.shard_of(request.request_id)]

        async def work() -> None:
            await _again(lambda: enqueue(*call), deadline)

        await _cut(deadline + requests.HARD_AFTER, f"request {request.request_id} not enqueued within {limit}s", work())
        return request.request_id

    @overload
    async def wait(self, request: ForkRequest, timeout: float, *, reply_to: str | None = None) -> Reply: ...

    @overload
    async def wait(self, request: MergeRequest, timeout: float, *, reply_to: str | None = None) -> MergeReply: ...

    @overload
    async def wait(self, request: SelectRequest, timeout: float, *, reply_to: str | None = None) -> SelectReply: ...

    @overload
    async def wait(self, request: str, timeout: float, *, reply_to: str | None = None) -> Outcome: ...

    async def wait(self, request: AnyRequest | str, timeout: float, *, reply_to: str | None = None) -> Outcome:
        """The reply to a submitted request; ``TimeoutError`` when none comes within ``timeout`` s
        (``INVALID_REQUEST`` for a ``timeout`` that is not 0 to ``MAX_WAIT`` seconds).

        A request id used before for a different request answers ``IDEMPOTENCY_CONFLICT``. The
        answer is the outcome stored under the request id; a message on the reply channel only
        wakes the waiter (one with nothing stored behind it is ignored).

        ``request`` may be a request id alone (a request submitted elsewhere), as for
        ``Client.wait``: its outcome, whatever request it was (no conflict to tell), woken on
        ``reply_to`` (default: the settings' reply channel). ``INVALID_REQUEST`` for an id outside
        ``[A-Za-z0-9_-]{1,128}``. A request id alone that its queue server does not know when the
        wait starts answers ``REQUEST_NOT_FOUND`` at once, as ``Client.wait`` does.
        """
        waited, digest = requests.waited(request, reply_to)
        timeout = requests.wait_bound(timeout)
        rid = waited.request_id
        assert isinstance(rid, str)
        deadline = asyncio.get_running_loop().time() + timeout
        router = self.routers[self.shard_of(rid)]
        redis, by_id = self.shards[self.shard_of(rid)], isinstance(request, str)

        async def work(woken: asyncio.Event) -> Outcome:
            if by_id and not int(await _again(lambda: redis.exists(*outcomes.known_keys(rid)), deadline)):
                raise errors.request_not_found(rid)
            return await self._answer(waited, digest, woken, None, deadline, timeout)

        async with router.expect(rid, self._channel(waited), deadline) as woken:
            return await _cut(deadline + requests.HARD_AFTER, _no_reply(rid, timeout), work(woken))

    async def fork(self, source: str | LiveHandle, *, timeout: float = 10.0,
                   **options: Unpack[ForkOptions]) -> Reply:
        """Submit a fork request (``request(source, **options)``: the options are ``ForkOptions``)
        and wait for its reply, within ``timeout`` seconds (subscribed first; enqueue and the first
        read of the stored outcome in one round trip, sent again when its reply is lost).
        ``INVALID_REQUEST`` for a ``timeout`` that is not 0 to ``MAX_WAIT`` seconds, and as
        ``request`` for the options (``TypeError`` for an unknown one), before anything is sent."""
        request = self._build(source, options, "AsyncClient.fork")
        return cast(Reply, await self.run_request(request, timeout))

    async def run_request(self, request: AnyRequest, timeout: float) -> Outcome:
        """A request built already, of any operation: subscribed first, then enqueued with the first
        read of its stored outcome, then its reply awaited, within ``timeout`` seconds."""
        request = requests.checked(request, to_wait=True)
        timeout = requests.wait_bound(timeout)
        request, call = self._job(request)
        rid = request.request_id
        assert isinstance(rid, str)
        deadline = asyncio.get_running_loop().time() + timeout
        router = self.routers[self.shard_of(rid)]

        async def work(woken: asyncio.Event) -> Outcome:
            first = await _again(lambda: self._enqueue_and_read(rid, call), deadline)
            return await self._answer(request, wire.digest(request), woken, first, deadline, timeout)

        async with router.expect(rid, self._channel(request), deadline) as woken:
            return await _cut(deadline + requests.HARD_AFTER, _no_reply(rid, timeout), work(woken))

    async def _enqueue_and_read(self, request_id: str, call: tuple[list[str], list[Any]]) -> list[Any]:
        """The enqueue script and the first read of the stored outcome, in one round trip."""
        enqueuer = self._enqueuers[self.shard_of(request_id)]
        _, first = await enqueuer.with_read(*call, ("HMGET", keys.request(request_id), *OUTCOME_FIELDS))
        return list(first)

    # -- internals ---------------------------------------------------------------------------------

    def _channel(self, request: AnyRequest) -> str:
        return requests.reply_channel(request, self.settings.reply_channel)

    def _job(self, request: R) -> tuple[R, tuple[list[Any], list[Any]]]:
        request, payload = requests.prepare(request, self._new_id)
        assert isinstance(request.request_id, str)
        return request, job_call(request.request_id, payload, self.settings, datetime.now(UTC))

    async def _answer(self, request: AnyRequest, digest: str | None, woken: asyncio.Event,
                      first: list[Any] | None, deadline: float, timeout: float) -> Outcome:
        """Read the stored outcome (``first``: read already) until it answers; between reads, wait
        for a wake-up (``woken``) or ``recheck_every`` seconds. A read whose reply is lost (a
        dropped connection) is sent again soon, until the deadline. Run in a task of its own
        (``_cut``). ``digest``: the request's, to tell a conflict (``None``: a wait by id alone)."""
        assert isinstance(request.request_id, str)
        rid = request.request_id
        redis = self.shards[self.shard_of(rid)]
        loop = asyncio.get_running_loop()
        stored, retry_in = first, _RETRY_FIRST
        while True:
            if stored is None:
                try:
                    stored = await redis.hmget(keys.request(rid), list(OUTCOME_FIELDS))
                except Exception as exc:
                    if not is_lost(exc):
                        raise
                    log.info("reading the outcome of %s failed (%s); reading it again", rid, exc)
            if stored is not None:
                found = verdict(rid, stored, digest, wire.op_of(request))
                if found is not None:
                    return found
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(_no_reply(rid, timeout))
            pause = self.recheck_every
            if stored is None:  # the read failed: again soon, backing off
                pause, retry_in = retry_in, min(retry_in * 2, _RETRY_MAX)
            stored = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(left, pause))
            woken.clear()  # before the read: a wake-up from now on brings another read


def _no_reply(request_id: str, timeout: float) -> str:
    return f"no reply to request {request_id} within {timeout}s"


def _bounded(settings: Settings, connection_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``connection_kwargs`` with the settings' time-outs where the caller gave none."""
    return {**connections.time_outs(settings), **connection_kwargs}


async def _cut(deadline: float, what: str, work: Coroutine[Any, Any, T]) -> T:
    """``work``'s result, ``work`` run in a task of its own: at ``deadline`` (loop time) a
    ``TimeoutError(what)``, and at the caller's cancellation a ``CancelledError``, at once either way,
    whatever ``work`` is doing (a frozen server's command, its client's retries, a cancellation
    redis-py swallowed): ``work`` is then cancelled until it ends (``_abandon``), its outcome dropped."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(work)
    task.add_done_callback(_retrieved)
    try:
        done, _ = await asyncio.wait((task,), timeout=max(deadline - loop.time(), 0.0))
    except BaseException:  # the caller's cancellation: it ends the call now, not when work lets it
        _abandon(task)
        raise
    if not done:
        _abandon(task)
        raise TimeoutError(what)
    return task.result()


_RECANCEL = 0.05
"""Seconds between the cancellations of a call's abandoned work (``_abandon``)."""


def _abandon(task: asyncio.Task[Any]) -> None:
    """Cancel ``task``, and again every ``_RECANCEL`` seconds until it ends: on Python 3.11,
    redis-py's ``asyncio.wait_for`` around a socket write or read can swallow one cancellation
    (the command then goes on, retried for as long as its client's time-outs allow)."""
    if not task.done():
        task.cancel()
        task.get_loop().call_later(_RECANCEL, _abandon, task)


def _retrieved(task: asyncio.Task[Any]) -> None:
    # An abandoned call's error is nobody's: read it, so asyncio does not log it as never retrieved.
    if not task.cancelled():
        task.exception()


_RETRY_FIRST, _RETRY_MAX = 0.05, 1.0
"""Back-off between attempts of a command whose reply was lost (seconds, doubling)."""

async def _again(send: Callable[[], Awaitable[T]], deadline: float) -> T:
    """``send()``, sent again after a back-off while its reply is lost, until ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    retry_in = _RETRY_FIRST
    while True:
        try:
            return await send()
        except Exception as exc:
            left = deadline - loop.time()
            if not is_lost(exc) or left <= retry_in:
                raise
            log.info("a command's reply was lost (%s); sending it again", exc)
            await asyncio.sleep(retry_in)  # back-off, not synchronisation
            retry_in = min(retry_in * 2, _RETRY_MAX)
