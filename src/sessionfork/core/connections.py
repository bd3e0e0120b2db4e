"""Redis clients from settings: the registry's (a server or a cluster) and the queue's (a server).

TLS: a ``rediss://`` URL connects over TLS, verifying the server against ``tls_ca_file`` when it
is set (else the system's CA store).

Sentinel: a ``redis+sentinel://`` URL (``config.parse_sentinel_url``) gives a client whose pool
asks the sentinels for the service's primary on every new connection (redis-py's
``SentinelConnectionPool``): after a promotion, the retried command reconnects to the new primary,
so nothing needs a restart. A connection that lands on a demoted primary (a read-only replica) is
dropped and retried the same way. The time-outs below bound the sentinels' connections too; a
sentinel is never retried (``NO_RETRY``: the next one is asked).

Bounds: every client has ``settings.socket_timeout`` per command and ``settings.connect_timeout``
per connection, so a frozen server (or a TLS client talking to a plain server) fails a command
within those seconds instead of hanging. A dropped connection is retried a few times with
back-off (a restarting server); a time-out is not retried by the client (it would multiply the
bound: callers that ride out outages, like the worker, retry the whole step), nor is a refused
password (retrying cannot fix it); ``stop_retrying`` ends a client's retries (a stopping worker).
RQ raises the socket time-out of a worker's own connection to cover its blocking dequeue.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from redis import Redis
from redis.asyncio import BlockingConnectionPool as AsyncBlockingPool
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import AuthenticationError, ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel

from .config import SENTINEL_SCHEMES, ConfigError, SentinelURL, Settings, parse_sentinel_url
from .packer import CommandPacker

T = TypeVar("T")
log = logging.getLogger("sessionfork.client")

TRANSIENT: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError)
"""Errors that mean Redis is briefly unreachable (a dropped connection, a restart, a failover):
the step is retried after a back-off, never reported as a failure of the request."""


class _Retry(Retry):
    """redis-py's ``Retry``, except that a refused password is final (retrying cannot fix it), and
    that ``halt`` ends the retries of every copy: redis-py deep-copies the policy into each
    connection, and the copies share the halt (``stop_retrying``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._halted: list[bool] = [False]  # shared by the copies

    def __deepcopy__(self, memo: dict[int, Any]) -> _Retry:
        twin = copy.copy(self)  # the halt shared; the back-off (its state) each copy's own
        twin._backoff = copy.deepcopy(self._backoff, memo)
        return twin

    def halt(self) -> None:
        self._halted[0] = True

    def get_retries(self) -> int:
        # A cluster client reads only this count (its nodes' connections never retry): halted,
        # a command's first failure is final.
        return 0 if self._halted[0] else super().get_retries()

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        # redis-py's loop, plus the halt and this thread's deadline (``retries_until``).
        self._backoff.reset()  # type: ignore[no-untyped-call]
        failures = 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if (self._halted[0] or isinstance(error, AuthenticationError)
                        or (is_retryable is not None and not is_retryable(error))):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)  # the connection's clean-up (a pub/sub's: its reconnection)
                if self._retries >= 0 and failures > self._retries:
                    raise
                pause = self._backoff.compute(failures)
                until = getattr(_deadlines, "until", None)
                if until is not None:
                    left = until - time.monotonic()
                    if left <= 0:
                        raise
                    pause = min(pause, left)
                if pause > 0:
                    time.sleep(pause)  # back-off, not synchronisation


_deadlines = threading.local()


@contextlib.contextmanager
def retries_until(deadline: float) -> Iterator[None]:
    """Within the block, the calling thread's commands (of this module's clients) are retried only
    until ``deadline`` (``time.monotonic()``): no back-off sleeps past it, and a failure past it is
    final, the reconnections of a pub/sub read and of a Sentinel discovery included (a sync wait
    across a failover: its reconnections otherwise added up to many times its time-out). A nested
    block keeps the earlier deadline."""
    outer = getattr(_deadlines, "until", None)
    _deadlines.until = deadline if outer is None else min(outer, deadline)
    try:
        yield
    finally:
        _deadlines.until = outer


def stop_retrying(client: Any) -> None:
    """From now on, a command of ``client`` (a client of this module's) that fails on a dropped
    connection fails at once, and so does one retrying now at its next failure: a stopping worker
    must not ride out an outage (with every sentinel gone, the retries of one command add up to
    seconds). Safe from a signal handler (one flag, no error): a ``RedisCluster`` keeps its policy
    as ``retry`` (its nodes' connections never retry), a ``Redis`` in its connection keywords."""
    retry = client.retry if isinstance(client, RedisCluster) else client.get_retry()
    if isinstance(retry, _Retry):
        retry.halt()


def time_outs(settings: Settings) -> dict[str, Any]:
    """The settings' bounds as redis-py's connection keywords: ``socket_timeout`` per command,
    ``socket_connect_timeout`` per connection (every client of this module's; the asyncio client's)."""
    return {"socket_timeout": settings.socket_timeout, "socket_connect_timeout": settings.connect_timeout}


def _options(url: str, settings: Settings, resend: bool = True) -> dict[str, Any]:
    options: dict[str, Any] = {
        # Ride out a dropped connection or a restarting server for a few seconds per command
        # (``resend``; else each connection error is raised at once: see ``queue_client``).
        "retry": _Retry(ExponentialBackoff(cap=1.0, base=0.05), 8 if resend else 0,
                        supported_errors=(RedisConnectionError,)),
        "retry_on_error": [RedisConnectionError],
        "health_check_interval": 30,
        # Arguments packed by hiredis in C, not encoded one by one in Python first (``packer``).
        "command_packer": CommandPacker(),
        **time_outs(settings),
    }
    if url.startswith(("rediss://", "rediss+sentinel://")) and settings.tls_ca_file:
        options["ssl_ca_certs"] = settings.tls_ca_file
    return options


def is_sentinel_url(url: str) -> bool:
    """``url`` names a primary through Sentinel (``redis+sentinel://`` or ``rediss+sentinel://``)."""
    return url.partition("://")[0] in SENTINEL_SCHEMES


NO_RETRY = Retry(NoBackoff(), 0)
"""The sentinels' connections' policy: none. A dead sentinel is skipped by the pool (the next one
is asked); redis-py 8's default (10 retries with back-off, per sentinel, inside each of the data
connection's own retries) made one command with every sentinel gone take a minute or more."""


def _sentinel_kwargs(settings: Settings) -> dict[str, Any]:
    # The sentinels' own connections: bounded like every other, no credentials (the URL's are the
    # data nodes'), no retry (NO_RETRY).
    return {**time_outs(settings), "retry": NO_RETRY}


def _node_kwargs(parsed: SentinelURL) -> dict[str, Any]:
    return {"db": parsed.db, "username": parsed.username, "password": parsed.password, "ssl": parsed.tls}


class _SentinelRedis(Redis):
    """A ``Redis`` on a Sentinel-managed primary whose ``close`` closes every connection it opened:
    the primary's and the sentinels' (redis-py's ``master_for`` client closes neither)."""

    def close(self) -> None:
        super().close()
        self.connection_pool.disconnect()
        for sentinel in getattr(self.connection_pool, "sentinel_manager").sentinels:  # noqa: B009
            sentinel.close()


def sentinel_client(settings: Settings, url: str, *, resend: bool = True) -> Redis:
    """A ``Redis`` on the current primary of the Sentinel ``url``, following its promotions
    (``resend``: as ``queue_client``'s)."""
    parsed = parse_sentinel_url(url)
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=_sentinel_kwargs(settings))
    client: Redis = sentinel.master_for(
        parsed.service, redis_class=_SentinelRedis, **_options(url, settings, resend), **_node_kwargs(parsed))
    return client


class _AsyncBlockingSentinelPool(AsyncSentinelPool, AsyncBlockingPool):
    """The asyncio Sentinel pool that waits for a free connection at ``max_connections`` (as
    ``BlockingConnectionPool``) instead of failing, and whose full disconnect (the client's
    ``aclose``) closes the sentinels' connections too."""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:  # not the idle-only disconnect of a primary change
            for sentinel in self.sentinel_manager.sentinels:
                await sentinel.aclose()


def async_pool(url: str, *, max_connections: int, **connection_kwargs: Any) -> AsyncBlockingPool:
    """An asyncio pool of at most ``max_connections`` connections for any URL this module takes;
    a Sentinel URL's pool follows its primary's promotions (``connection_kwargs`` go to the data
    nodes' connections; their ``socket_*`` time-outs bound the sentinels' connections too)."""
    if not is_sentinel_url(url):
        return AsyncBlockingPool.from_url(url, max_connections=max_connections, **connection_kwargs)
    parsed = parse_sentinel_url(url)
    bounds = {k: v for k, v in connection_kwargs.items() if k in ("socket_timeout", "socket_connect_timeout")}
    bounds["retry"] = AsyncRetry(NoBackoff(), 0)  # as NO_RETRY: a dead sentinel is skipped
    sentinel = AsyncSentinel(list(parsed.sentinels), sentinel_kwargs=bounds)
    client: AsyncRedis = sentinel.master_for(parsed.service, connection_pool_class=_AsyncBlockingSentinelPool,
                                             max_connections=max_connections,
                                             **{**_node_kwargs(parsed), **connection_kwargs})
    pool: AsyncBlockingPool = client.connection_pool  # type: ignore[assignment]
    return pool


def registry_client(settings: Settings, url: str, *, resend: bool = True) -> Redis | RedisCluster:
    """The registry's client: a ``RedisCluster`` when ``settings.cluster`` (which follows its
    slots' moves whatever ``resend``), else a ``Redis`` (``resend``: as ``queue_client``'s)."""
    if settings.cluster:
        if is_sentinel_url(url):
            raise ConfigError("a Redis Cluster is not reached through Sentinel: give a cluster node's redis:// URL")
        return RedisCluster.from_url(url, **_options(url, settings))
    return queue_client(settings, url, resend=resend)


def queue_client(settings: Settings, url: str, *, resend: bool = True) -> Redis:
    """The queue server's client (RQ, outcomes, replies). RQ needs one primary, never a cluster;
    a Sentinel URL gives the client of its current primary.

    ``resend``: a command whose connection dropped is sent again on a new connection (a few
    times, with back-off). ``False`` is the worker's: a command sent again after a promotion (or
    a restart that lost data) reaches a server that may lack what the request's earlier steps
    wrote (a record would name a child the new primary never had), so each connection error is
    raised at once and the worker runs the whole step again from the claim, on the server it
    reaches then (``SeamWorker.until_up``)."""
    if is_sentinel_url(url):
        return sentinel_client(settings, url, resend=resend)
    return Redis.from_url(url, **_options(url, settings, resend))


class CallThread:
    """A daemon thread that runs ``cut_at``'s work, one call at a time, kept between calls: a thread
    started for each call cost about 100 µs of every sync call, and more on a loaded machine (a
    lone fork's enqueue-to-reply p50 2.89 ms against 3.25, p99 5.58 against 6.22, in one run).

    It ends once ``idle`` seconds pass without a call (an abandoned client leaves no thread for
    long); the next call starts it again. One caller's at a time: a call cut at its deadline may
    still run in it, so its owner drops it then and takes a new one (``Client`` keeps one per
    thread)."""

    def __init__(self, idle: float = 5.0) -> None:
        self.idle = idle
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False  # a thread serves the calls (it may be about to end: see _serve)

    def run(self, call: Callable[[], None]) -> None:
        """Run ``call`` in the thread (started now if it had ended). ``call`` must not raise."""
        with self._lock:
            self._calls.put(call)
            if not self._running:
                self._running = True
                threading.Thread(target=self._serve, name="sessionfork-call", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                call = self._calls.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:  # a call put before this lock is served; one after it starts a thread
                    if self._calls.empty():
                        self._running = False
                        return
                continue
            call()


def cut_at(deadline: float, work: Callable[[], T], what: str, *, on_cut: Callable[[], None] | None = None,
            after_cut: Callable[[], None] | None = None, caller: CallThread | None = None) -> T:
    """``work()``'s result (or its error) if it ends by ``deadline`` (``time.monotonic``), else
    ``TimeoutError(what)`` then. The work runs in another thread (``caller``'s, else a daemon thread
    of its own), so that no Redis
    call holds the caller past the deadline: a frozen server, a ``Redis`` whose ``Retry`` sends a
    timed-out command again (redis-py 8's ``Redis(host, port)``: 10 more times, with back-off: a 1 s
    fork took 9 s with a 0.5 s ``socket_timeout``), one without time-outs. Cut (the deadline, or
    the caller interrupted): ``on_cut`` runs in the caller's thread at once, and ``after_cut`` in
    the work's thread when the work ends, whenever redis-py gives up (what it used is never shared
    with a later call)."""
    lock, ended = threading.Lock(), threading.Event()
    result: list[tuple[bool, Any]] = []
    cut = False

    def run() -> None:
        try:
            result.append((True, work()))
        except BaseException as exc:  # handed to the caller (or dropped, if it has gone)
            result.append((False, exc))
        with lock:
            ended.set()
            late = cut
        if late and after_cut is not None:
            try:
                after_cut()
            except Exception:  # nobody to hand it to: the caller has gone
                log.warning("cleaning up after a call cut at its deadline failed", exc_info=True)

    if caller is None:
        threading.Thread(target=run, name="sessionfork-call", daemon=True).start()
    else:
        caller.run(run)
    try:
        ended.wait(max(deadline - time.monotonic(), 0.0))
    finally:
        with lock:
            cut = not ended.is_set()
        if cut and on_cut is not None:
            on_cut()
    if cut:
        raise TimeoutError(what)
    ok, value = result[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value
