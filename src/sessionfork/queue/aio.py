"""The asyncio scheduler client: submit fork requests and await their replies on ``redis.asyncio``.

    async with AsyncClient.from_url("redis://localhost:6379/0") as client:
        reply = await client.fork("sess-a", session_id="child-1", timeout=5)

Same semantics as the sync ``queue.client.Client``: a request id makes a submission idempotent
(submitting it again, or waiting again after a time-out, never forks twice and answers the first
outcome), a request id reused for a different request answers ``IDEMPOTENCY_CONFLICT``, and
``wait`` raises ``TimeoutError`` when no reply comes in time.

RQ has no asyncio API: a request is enqueued by ``scripts/enqueue.lua`` (the README's any-language
recipe) with the job hash RQ's own enqueue writes (``rq_seam.layout``). Importing this module imports
no RQ.

One subscription per client (``ReplyRouter``) serves every waiter: each reply is routed by its
request id. A waiter registers, waits until the subscription to its reply channel is confirmed,
then reads the stored outcome, so a reply published before it listened is never lost; the stored
outcome is read again every ``recheck_every`` seconds without news (after a reconnection, or for
a reply announced on another channel). A waiter that returns, times out or is cancelled removes
itself, and the client unsubscribes from a channel no waiter needs any more.

Connections: the subscription holds one connection of ``redis``'s pool for the client's life;
commands share the others. ``AsyncClient.from_url(url, max_connections=4)`` never opens more than 4.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import msgspec
from msgspec import UNSET
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from ..core import connections, keys, lua, rules, wire
from ..core.config import Settings
from ..core.errors import ErrorCode
from ..core.factories import new_request_id
from ..core.wire import ForkFailure, ForkRequest, LiveHandle, Reply
from . import requests, tracing
from .outcomes import judge
from .rq_seam import layout as rq_layout
from .subscriptions import ReplyRouter


class AsyncClient:
    """A scheduler's asyncio handle on the fork queue (``redis`` is the queue server).

    All of ``request``, ``submit``, ``wait`` and ``fork`` are coroutines (``request`` does no I/O).
    """

    def __init__(self, redis: Redis, settings: Settings | None = None, *,
                 new_id: Callable[[], str] = new_request_id, recheck_every: float = 1.0) -> None:
        self.redis = redis
        self.settings = settings or Settings()
        self.replies = ReplyRouter(redis)
        self.recheck_every = recheck_every
        self._new_id = new_id
        self._enqueue = redis.register_script(lua.source("enqueue.lua", __package__))
        self._queue_key = rq_layout.queue_key(self.settings.queue)

    @classmethod
    def from_url(cls, url: str, settings: Settings | None = None, *, max_connections: int = 4,
                 new_id: Callable[[], str] = new_request_id, recheck_every: float = 1.0,
                 **connection_kwargs: Any) -> AsyncClient:
        """A client that never holds more than ``max_connections`` connections (2 at least: the
        subscription and one for commands); ``connection_kwargs`` go to the connection pool. A
        ``redis+sentinel://`` URL follows its primary's promotions."""
        pool = connections.async_pool(url, max_connections=max(max_connections, 2), **connection_kwargs)
        return cls(Redis.from_pool(pool), settings, new_id=new_id, recheck_every=recheck_every)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Drop the subscription and close the connections."""
        await self.replies.aclose()
        await self.redis.aclose()

    async def request(self, source: str | LiveHandle, *, session_id: str | None = None,
                      session_ids: list[str] | None = None, count: int | None = None,
                      request_id: str | None = None, reply_to: str | None = None,
                      boundary: int | None = None) -> ForkRequest:
        """Build a request (no I/O): as ``Client.request``; ``INVALID_REQUEST`` for a bad request id.
        ``boundary``: fork at that inclusive event seq. With OpenTelemetry installed, it carries the
        current trace context (``traceparent``)."""
        return requests.build(source, request_id or self._new_id(), session_id=session_id, session_ids=session_ids,
                              count=count, reply_to=reply_to, boundary=boundary,
                              traceparent=tracing.current_traceparent())

    async def submit(self, request: ForkRequest) -> str:
        """Enqueue ``request``; returns its request id. Enqueuing an id already queued is a no-op."""
        request, args = self._job(request)
        assert isinstance(request.request_id, str)
        await self._enqueue(keys=self._job_keys(request.request_id), args=args)
        return request.request_id

    async def wait(self, request: ForkRequest, timeout: float) -> Reply:
        """The reply to a submitted request; ``TimeoutError`` when none comes within ``timeout`` s.

        A request id used before for a different request answers ``IDEMPOTENCY_CONFLICT``.
        """
        assert isinstance(request.request_id, str), "submit() the request first"
        deadline = asyncio.get_running_loop().time() + timeout
        async with self.replies.expect(request.request_id, self._channel(request), deadline) as inbox:
            first = await self.redis.hmget(keys.request(request.request_id), ["digest", "outcome"])
            return await self._answer(request, inbox, first, deadline, timeout)

    async def fork(self, source: str | LiveHandle, *, timeout: float = 10.0, session_id: str | None = None,
                   session_ids: list[str] | None = None, count: int | None = None,
                   request_id: str | None = None, reply_to: str | None = None,
                   boundary: int | None = None) -> Reply:
        """Submit a fork request and wait for its reply (subscribed first; enqueue and the first
        read of the stored outcome in one round trip)."""
        request = await self.request(source, session_id=session_id, session_ids=session_ids, count=count,
                                     request_id=request_id, reply_to=reply_to, boundary=boundary)
        request, args = self._job(request)
        assert isinstance(request.request_id, str)
        deadline = asyncio.get_running_loop().time() + timeout
        async with self.replies.expect(request.request_id, self._channel(request), deadline) as inbox:
            job_keys = self._job_keys(request.request_id)
            for attempt in (1, 2):
                pipe = self.redis.pipeline(transaction=False)
                pipe.evalsha(self._enqueue.sha, len(job_keys), *job_keys, *args)
                pipe.hmget(keys.request(request.request_id), ["digest", "outcome"])
                enqueued, first = await pipe.execute(raise_on_error=False)
                if not isinstance(enqueued, NoScriptError) or attempt == 2:
                    break
                self._enqueue.sha = await self.redis.script_load(self._enqueue.script)
            for result in (enqueued, first):
                if isinstance(result, Exception):
                    raise result
            return await self._answer(request, inbox, first, deadline, timeout)

    # -- internals ---------------------------------------------------------------------------------

    def _job_keys(self, request_id: str) -> list[str]:
        """The enqueue script's keys: RQ's job hash and queue, the request's record, RQ's queue set."""
        return [rq_layout.job_key(request_id), self._queue_key, keys.request(request_id), rq_layout.QUEUES]

    def _channel(self, request: ForkRequest) -> str:
        return self.settings.reply_channel if request.reply_to is UNSET else request.reply_to

    def _job(self, request: ForkRequest) -> tuple[ForkRequest, list[Any]]:
        if request.request_id is UNSET:
            request = msgspec.structs.replace(request, request_id=self._new_id())
        assert isinstance(request.request_id, str)
        rules.check_request_id(request.request_id)
        payload = wire.encode(request)
        fields = rq_layout.job_fields(payload, self.settings, datetime.now(UTC))
        return request, [request.request_id, payload, *fields]

    async def _answer(self, request: ForkRequest, inbox: asyncio.Queue[bytes], first: list[Any],
                      deadline: float, timeout: float) -> Reply:
        assert isinstance(request.request_id, str)
        rid, digest = request.request_id, wire.digest(request)
        found = judge(rid, first[0], first[1], digest)
        loop = asyncio.get_running_loop()
        while found is None:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no reply to request {rid} within {timeout}s")
            raw: bytes | None = None
            with contextlib.suppress(TimeoutError):
                raw = await asyncio.wait_for(inbox.get(), min(left, self.recheck_every))
            stored = await self.redis.hmget(keys.request(rid), ["digest", "outcome"])
            found = judge(rid, stored[0], stored[1], digest)
            if found is None and raw is not None:
                reply = wire.decode_reply(raw)
                # A conflict announced for the *other* request under this id is not ours.
                if not (isinstance(reply, ForkFailure) and reply.code == ErrorCode.IDEMPOTENCY_CONFLICT.value):
                    found = reply
        return found
