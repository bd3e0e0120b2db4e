"""Redis clients from settings: the registry's (a server or a cluster) and the queue's (a server).

TLS: a ``rediss://`` URL connects over TLS, verifying the server against ``tls_ca_file`` when it
is set (else the system's CA store).
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from .config import Settings

TRANSIENT: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError)
"""Errors that mean Redis is briefly unreachable (a dropped connection, a restart, a failover):
the step is retried after a back-off, never reported as a failure of the request."""


def _options(url: str, settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {
        # Ride out a dropped connection or a restarting server for a few seconds per command.
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), 8),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        "health_check_interval": 30,
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
