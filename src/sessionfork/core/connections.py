"""Redis clients from settings: the registry's (a server or a cluster) and the queue's (a server).

TLS: a ``rediss://`` URL connects over TLS, verifying the server against ``tls_ca_file`` when it
is set (else the system's CA store).

Bounds: every client has ``settings.socket_timeout`` per command and ``settings.connect_timeout``
per connection, so a frozen server (or a TLS client talking to a plain server) fails a command
within those seconds instead of hanging. A dropped connection is retried a few times with
back-off (a restarting server); a time-out is not retried by the client (it would multiply the
bound: callers that ride out outages, like the worker, retry the whole step), nor is a refused
password (retrying cannot fix it). RQ raises the socket time-out of a worker's own connection to
cover its blocking dequeue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import AuthenticationError, ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from .config import Settings

T = TypeVar("T")

TRANSIENT: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError)
"""Errors that mean Redis is briefly unreachable (a dropped connection, a restart, a failover):
the step is retried after a back-off, never reported as a failure of the request."""


class _Retry(Retry):
    """redis-py's ``Retry``, except that a refused password is final: retrying cannot fix it."""

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        def retryable(error: Exception) -> bool:
            return not isinstance(error, AuthenticationError) and (is_retryable is None or is_retryable(error))

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def _options(url: str, settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {
        # Ride out a dropped connection or a restarting server for a few seconds per command.
        "retry": _Retry(ExponentialBackoff(cap=1.0, base=0.05), 8, supported_errors=(RedisConnectionError,)),
        "retry_on_error": [RedisConnectionError],
        "health_check_interval": 30,
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.connect_timeout,
    }
    if url.startswith("rediss://") and settings.tls_ca_file:
        options["ssl_ca_certs"] = settings.tls_ca_file
    return options


def registry_client(settings: Settings, url: str) -> Redis | RedisCluster:
    """The registry's client: a ``RedisCluster`` when ``settings.cluster``, else a ``Redis``."""
    if settings.cluster:
        return RedisCluster.from_url(url, **_options(url, settings))
    return Redis.from_url(url, **_options(url, settings))


def queue_client(settings: Settings, url: str) -> Redis:
    """The queue server's client (RQ, outcomes, replies). RQ needs one primary, never a cluster."""
    return Redis.from_url(url, **_options(url, settings))
