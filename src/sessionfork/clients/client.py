"""What a scheduler imports: submit fork requests, and wait for their replies.

    client = Client.from_url("redis://localhost:6379/0")
    reply = client.fork("sess-a", session_id="child-1", timeout=5)
    if reply.ok: print(reply.child.id)   # a ForkResult (a ForkFailure's ok is Literal[False])
    merged = client.merge("sess-a", "child-1", mode="summary", summary={"text": "done"}, timeout=5)
    if merged.ok: print(merged.length)   # a MergeResult: the parent's new length

A request id (given, or generated as ``req-<uuid4>``) makes a submission idempotent: submitting
it again, or retrying after a time-out, never forks twice and always answers the first outcome.

Bounds: ``fork`` and ``wait`` return or raise ``TimeoutError`` by their deadline (``requests.HARD_AFTER``
past it at most), ``submit`` by ``requests.SUBMIT_RETRY_FOR`` seconds, whatever the server and ``redis`` do
(its retries, no time-outs): a call's Redis work runs in another thread (``connections.cut_at``): one
per calling thread, kept between its calls, ended after 5 idle seconds (``connections.CallThread``).

A sharded queue: give one client per queue server, in shard order (``Client([r0, r1, r2])`` or
``Client.from_urls([...])``); each request is enqueued on, and waited for on, the shard
``shards.shard_of(request_id, n)`` names, so a retry and a waiter find it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar, Unpack, cast, overload

from redis import Redis

from ..core import connections, errors, wire
from ..core.config import Settings, split_urls
from ..core.factories import new_request_id
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
from ..protocol.enqueue import Enqueuer, job_call
from ..protocol.merge_requests import ClientMergeOptions
from ..protocol.requests import ForkOptions
from .waiting import ReplyListener

T = TypeVar("T")
log = logging.getLogger("sessionfork.client")


class Client:
    """A scheduler's handle on the fork queue: ``redis`` is the queue server, or the queue servers
    of a sharded queue in shard order (``redis`` is then the first shard's).
    ``recheck_every``: seconds a wait goes without news before it reads the stored outcome again."""

    recheck_every: float = 1.0

    def __init__(self, redis: Redis | Sequence[Redis], settings: Settings | None = None, *,
                 new_id: Callable[[], str] = new_request_id) -> None:
        self.shards = [redis] if isinstance(redis, Redis) else list(redis)
        if not self.shards:
            raise ValueError("a Client needs at least one queue server")
        self.settings = settings or Settings()
        self.redis = self.shards[0]
        self._new_id = new_id
        self._enqueuers = [Enqueuer(shard, self.settings) for shard in self.shards]
        self._local = threading.local()  # each thread's reply listeners, by shard

    @classmethod
    def from_url(cls, url: str, settings: Settings | None = None, *,
                 new_id: Callable[[], str] = new_request_id) -> Client:
        """A client of the queue server at ``url``, any form ``SESSIONFORK_QUEUE_URL`` takes (a
        ``redis+sentinel://`` URL follows its primary's promotions), its connections bounded by the
        settings' time-outs; ``AsyncClient.from_url``'s counterpart."""
        settings = settings or Settings()
        return cls(connections.queue_client(settings, url), settings, new_id=new_id)

    @classmethod
    def from_urls(cls, urls: str | Sequence[str], settings: Settings | None = None, *,
                  new_id: Callable[[], str] = new_request_id) -> Client:
        """A client of the queue servers at ``urls`` (a list, or one comma-separated string split by
        ``config.split_urls``: a Sentinel URL's hosts stay together), in shard order; each URL
        any form ``SESSIONFORK_QUEUE_URL`` takes (Sentinel too)."""
        settings = settings or Settings()
        listed = split_urls(urls, "urls") if isinstance(urls, str) else list(urls)
        return cls([connections.queue_client(settings, url.strip()) for url in listed], settings, new_id=new_id)

    def shard_of(self, request_id: str) -> int:
        """The shard (index into ``shards``) that holds ``request_id``."""
        return shards.shard_of(request_id, len(self.shards))

    def request(self, source: str | LiveHandle, **options: Unpack[ForkOptions]) -> ForkRequest:
        """Build a request (no I/O) forking ``source`` with ``options``: each is documented, once, on
        ``ForkOptions`` (``session_id``, ``session_ids``, ``count``, ``request_id``, ``reply_to``,
        ``boundary``, ``if_length``, ``edits``, ``variants``, ``summary``). A generated request id
        (``new_id``) when none is given. ``TypeError`` for an unknown option; ``INVALID_REQUEST`` for
        a request id outside ``[A-Za-z0-9_-]{1,128}`` (it is the RQ job id), edits that are not
        ``NewEvent``, variants that are not ``Variant``, a summary that is not a ``Summary``. With
        OpenTelemetry installed, it carries the current trace context (``traceparent``)."""
        return self._build(source, options, "Client.request")

    def _build(self, source: str | LiveHandle, options: ForkOptions, where: str) -> ForkRequest:
        return requests.build(source, options, self._new_id, traceparent=tracing.current_traceparent(), where=where)

    def merge_request(self, parent: str | LiveHandle, child: str,
                      **options: Unpack[ClientMergeOptions]) -> MergeRequest:
        """Build a merge request (no I/O): ``child``'s events into ``parent`` with ``options``
        (``ClientMergeOptions``: ``mode`` required, ``summary``, ``range``, ``if_parent_length``,
        ``if_child_length``, ``request_id``, ``reply_to``). ``TypeError`` for an unknown option;
        ``INVALID_REQUEST`` for what the merge's rules refuse before any I/O."""
        request = merge_requests.build("merge", parent, options, self._new_id, child=child,
                                       traceparent=tracing.current_traceparent())
        assert isinstance(request, MergeRequest)
        return request

    def select_request(self, parent: str | LiveHandle, candidates: Sequence[str], winner: str,
                       **options: Unpack[ClientMergeOptions]) -> SelectRequest:
        """Build a select request (no I/O): ``winner`` merged into ``parent`` as ``merge_request``
        merges, every other of ``candidates`` abandoned; ``options`` as ``merge_request``'s."""
        request = merge_requests.build("select", parent, options, self._new_id, child=winner, candidates=candidates,
                                       traceparent=tracing.current_traceparent())
        assert isinstance(request, SelectRequest)
        return request

    def submit(self, request: AnyRequest) -> str:
        """Enqueue ``request``; returns its request id. Enqueuing an id already queued is a no-op.
        Returns or raises within ``SUBMIT_RETRY_FOR`` seconds (then ``TimeoutError``: the request
        may be enqueued all the same), whatever the server and ``redis`` do (``connections.cut_at``)."""
        request, limit = requests.prepare(request, self._new_id)[0], requests.SUBMIT_RETRY_FOR
        caller = self._caller()
        return connections.cut_at(time.monotonic() + limit, lambda: self._submit(request)[0],
                                  f"request {request.request_id} not enqueued within {limit}s",
                                  on_cut=lambda: self._drop_caller(caller), caller=caller)

    def _submit(self, request: AnyRequest) -> tuple[str, int]:
        """The request id, and the enqueue script's answer (1: enqueued now)."""
        request, payload = requests.prepare(request, self._new_id)
        assert isinstance(request.request_id, str)
        shard = self.shard_of(request.request_id)
        enqueued = self._enqueuers[shard](*job_call(request.request_id, payload, self.settings, datetime.now(UTC)))
        return request.request_id, enqueued

    @overload
    def wait(self, request: ForkRequest, timeout: float, *, reply_to: str | None = None) -> Reply: ...

    @overload
    def wait(self, request: MergeRequest, timeout: float, *, reply_to: str | None = None) -> MergeReply: ...

    @overload
    def wait(self, request: SelectRequest, timeout: float, *, reply_to: str | None = None) -> SelectReply: ...

    @overload
    def wait(self, request: str, timeout: float, *, reply_to: str | None = None) -> Outcome: ...

    def wait(self, request: AnyRequest | str, timeout: float, *, reply_to: str | None = None) -> Outcome:
        """The reply to a submitted request (a fork's ``Reply``, a merge's ``MergeReply``, a select's
        ``SelectReply``); ``TimeoutError`` when none comes within ``timeout`` s (``INVALID_REQUEST``
        for a ``timeout`` that is not 0 to ``MAX_WAIT`` seconds).

        A request id used before for a different request answers ``IDEMPOTENCY_CONFLICT``. The
        answer is the outcome stored under the request id; a message on the reply channel only
        wakes the waiter (one with nothing stored behind it is ignored). The client stays
        subscribed to the reply channel after the wait (one subscription per thread and queue
        server, kept for the next wait: ``close`` ends it).

        ``request`` may be a request id alone (a request submitted elsewhere: ``sessionfork wait
        ID``): its outcome, whatever request it was (no conflict to tell), woken on ``reply_to``
        (default: the settings' reply channel; one announced elsewhere is read within
        ``recheck_every``). ``INVALID_REQUEST`` for an id outside ``[A-Za-z0-9_-]{1,128}``.

        A request id alone that its queue server does not know when the wait starts (no job:
        neither queued nor running; no stored outcome) answers ``ForkError`` ``REQUEST_NOT_FOUND``
        at once, not a ``TimeoutError`` at the deadline: a wait by id that times out is for a
        request queued or running.
        """
        waited, digest = requests.waited(request, reply_to)
        timeout = requests.wait_bound(timeout)
        by_id = isinstance(request, str)

        def work(listener: ReplyListener, deadline: float) -> Outcome:
            assert isinstance(waited.request_id, str)
            with connections.retries_until(deadline):
                if by_id and not outcomes.is_known(self.shards[self.shard_of(waited.request_id)], waited.request_id):
                    raise errors.request_not_found(waited.request_id)
            return self._wait(listener, waited, deadline, timeout, digest)

        return self._bounded(waited, timeout, work)

    def _wait(self, listener: ReplyListener, request: AnyRequest, deadline: float, timeout: float,
              digest: str | None, *, announced_after_ready: bool = False) -> Outcome:
        """The reply by ``deadline`` (``time.monotonic``) of a call of ``timeout`` seconds (with
        ``digest``: a conflict for another request's id)."""
        assert isinstance(request.request_id, str), "submit() the request first"
        channel = requests.reply_channel(request, self.settings.reply_channel)
        reply = listener.wait(request.request_id, channel, max(deadline - time.monotonic(), 0.0),
                              digest=digest, op=wire.op_of(request), announced_after_ready=announced_after_ready,
                              recheck_every=self.recheck_every)
        if reply is None:
            raise TimeoutError(_no_reply(request.request_id, timeout))
        return reply

    def _bounded(self, request: AnyRequest, timeout: float,
                 work: Callable[[ReplyListener, float], Outcome]) -> Outcome:
        """``work(listener, deadline)`` with this thread's listener of the request's shard, cut
        ``HARD_AFTER`` seconds past the deadline (``connections.cut_at``: ``TimeoutError``). A call cut there
        leaves its listener to the work still running (which closes it when it ends): this
        thread's next wait subscribes anew."""
        assert isinstance(request.request_id, str)
        shard = self.shard_of(request.request_id)
        listener, listeners = self._listener(shard), self._local.__dict__["listeners"]
        deadline = time.monotonic() + timeout
        caller = self._caller()

        def cut() -> None:
            if listeners.get(shard) is listener:
                del listeners[shard]
            self._drop_caller(caller)

        return connections.cut_at(deadline + requests.HARD_AFTER, lambda: work(listener, deadline),
                                  _no_reply(request.request_id, timeout), on_cut=cut, after_cut=listener.close,
                                  caller=caller)

    def _caller(self) -> connections.CallThread:
        """This thread's ``CallThread``: its calls' Redis work runs there (``connections.cut_at``)."""
        caller: connections.CallThread | None = self._local.__dict__.get("caller")
        if caller is None:
            caller = self._local.__dict__["caller"] = connections.CallThread()
        return caller

    def _drop_caller(self, caller: connections.CallThread) -> None:
        """After a call cut at its deadline (it may still run in ``caller``): this thread's next
        call takes a new ``CallThread``."""
        if self._local.__dict__.get("caller") is caller:
            del self._local.__dict__["caller"]

    def _listener(self, shard: int) -> ReplyListener:
        listeners: dict[int, ReplyListener] = self._local.__dict__.setdefault("listeners", {})
        if shard not in listeners:
            listeners[shard] = ReplyListener(self.shards[shard])
        return listeners[shard]

    def close(self) -> None:
        """End this thread's reply subscriptions (their connections go back to the pools)."""
        for listener in self._local.__dict__.pop("listeners", {}).values():
            listener.close()

    def fork(self, source: str | LiveHandle, *, timeout: float = 10.0, **options: Unpack[ForkOptions]) -> Reply:
        """Submit a fork request (``request(source, **options)``: the options are ``ForkOptions``)
        and wait for its reply, within ``timeout`` seconds.

        The reply subscription is confirmed before the request is enqueued, so a new request's
        outcome is announced to it: the stored outcome is read once, when a message wakes the
        waiter (an id already used reads it at once). ``INVALID_REQUEST`` for a ``timeout`` that is not
        0 to ``MAX_WAIT`` seconds (``requests.wait_bound``), and as ``request`` for the options
        (``TypeError`` for an unknown one), before anything is sent."""
        request = self._build(source, options, "Client.fork")
        return self.fork_request(request, requests.wait_bound(timeout))

    def fork_request(self, request: ForkRequest, timeout: float) -> Reply:
        """``fork`` of a request built already (``request``): subscribed first, then enqueued, then
        its reply awaited, all within ``timeout`` seconds (``INVALID_REQUEST`` for one that is not
        0 to ``MAX_WAIT``); the CLI's ``fork --wait``."""
        return cast(Reply, self.run_request(request, timeout))

    def merge(self, parent: str | LiveHandle, child: str, *, timeout: float = 10.0,
              **options: Unpack[ClientMergeOptions]) -> MergeReply:
        """Submit a merge request (``merge_request(parent, child, **options)``) and wait for its
        reply (``MergeResult`` or ``MergeFailure``) within ``timeout`` seconds, as ``fork`` does."""
        request = self.merge_request(parent, child, **options)
        return cast(MergeReply, self.run_request(request, requests.wait_bound(timeout)))

    def select(self, parent: str | LiveHandle, candidates: Sequence[str], winner: str, *, timeout: float = 10.0,
               **options: Unpack[ClientMergeOptions]) -> SelectReply:
        """Submit a select request (``select_request(parent, candidates, winner, **options)``) and wait
        for its reply (``SelectResult`` or ``SelectFailure``) within ``timeout`` seconds."""
        request = self.select_request(parent, candidates, winner, **options)
        return cast(SelectReply, self.run_request(request, requests.wait_bound(timeout)))

    def run_request(self, request: AnyRequest, timeout: float) -> Outcome:
        """A request built already, of any operation: subscribed first, then enqueued, then its reply
        awaited, all within ``timeout`` seconds (``INVALID_REQUEST`` for one that is not 0 to
        ``MAX_WAIT``); the CLI's ``--wait``."""
        request, timeout = requests.checked(request, to_wait=True), requests.wait_bound(timeout)
        channel = requests.reply_channel(request, self.settings.reply_channel)

        def work(listener: ReplyListener, deadline: float) -> Outcome:
            ready = listener.ready(channel, deadline)
            _, enqueued = self._submit(request)
            return self._wait(listener, request, deadline, timeout, wire.digest(request),
                              announced_after_ready=ready and enqueued == 1)

        return self._bounded(request, timeout, work)


def _no_reply(request_id: str, timeout: float) -> str:
    return f"no reply to request {request_id} within {timeout}s"
