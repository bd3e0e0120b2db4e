"""Settings, read from an injected environment mapping (only entry points pass ``os.environ``).

Every limit and timing of the service is here, with its default and the variable that sets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ..core import keys


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Service settings. Each field's environment variable is in ``ENV``."""

    redis_url: str | None = None
    """Registry server (``REDIS_URL``); ``rediss://`` for TLS. ``None``: the demo's embedded one."""
    queue_url: str | None = None
    """Queue server for RQ, outcomes and replies (``SESSIONFORK_QUEUE_URL``); default: redis_url."""
    cluster: bool = False
    """Registry is a Redis Cluster (``SESSIONFORK_CLUSTER=1``)."""
    tls_ca_file: str | None = None
    """CA bundle for ``rediss://`` connections (``SESSIONFORK_TLS_CA_FILE``)."""
    queue: str = keys.DEFAULT_QUEUE
    reply_channel: str = keys.DEFAULT_REPLY_CHANNEL
    max_request_bytes: int = 64 * 1024
    """Largest request payload accepted; larger is ``INVALID_REQUEST`` before any work."""
    max_fanout: int = 1024
    """Most children one request may create."""
    max_event_bytes: int = 1024 * 1024
    """Largest single event accepted on append."""
    max_id_length: int = 128
    """Longest session or request id a request may name (1-128; the id rule allows 128)."""
    outcome_ttl: int = 7 * 24 * 3600
    """Seconds an outcome (and so the idempotency of its request id) is kept."""
    outcome_stream_maxlen: int = 100_000
    """Approximate cap of the outcome stream (XADD MAXLEN ~)."""
    job_ttl: int = 600
    """Seconds RQ keeps a finished job (its hash, result and finished-registry entry): what
    rq-dashboard shows. The outcome itself stays ``outcome_ttl`` in ``sf:req:<id>``."""
    job_timeout: int = 30
    """Seconds one fork job may run before RQ's timeout fails it."""
    retries: int = 3
    """Times a failed or abandoned job is retried before its request ends ``INTERNAL``."""
    abandoned_after: int = 30
    """Seconds after which a job whose worker stopped heart-beating counts as abandoned."""
    maintenance_interval: int = 15
    """Seconds between a worker's maintenance passes (abandoned-job recovery among them).

    A job of a SIGKILLed worker is requeued within ``abandoned_after + maintenance_interval``
    seconds (45 s by default)."""
    worker_ttl: int = 60
    """Seconds a worker's heartbeat is trusted (``sessionfork health``)."""
    retention: int = 0
    """Seconds a disposed session is kept before the workers' maintenance pass (and ``sessionfork
    gc``) deletes it; 0 = off (sessions are kept until deleted by hand). Never a live session."""
    delete_after_persist: bool = False
    """Deletion waits for the persistence backend: a session is removed from Redis only once its
    JSONL file holds its whole log (``sessionfork persist`` running)."""
    wait_replicas: int = 0
    """Replicas that must acknowledge a fork before it is reported (WAIT), 0 = don't wait."""
    wait_timeout_ms: int = 1000


ENV: Mapping[str, str] = {
    "redis_url": "REDIS_URL",
    "queue_url": "SESSIONFORK_QUEUE_URL",
    "cluster": "SESSIONFORK_CLUSTER",
    "tls_ca_file": "SESSIONFORK_TLS_CA_FILE",
    "queue": "SESSIONFORK_QUEUE",
    "reply_channel": "SESSIONFORK_REPLY_CHANNEL",
    "max_request_bytes": "SESSIONFORK_MAX_REQUEST_BYTES",
    "max_fanout": "SESSIONFORK_MAX_FANOUT",
    "max_event_bytes": "SESSIONFORK_MAX_EVENT_BYTES",
    "max_id_length": "SESSIONFORK_MAX_ID_LENGTH",
    "outcome_ttl": "SESSIONFORK_OUTCOME_TTL",
    "outcome_stream_maxlen": "SESSIONFORK_OUTCOME_STREAM_MAXLEN",
    "job_ttl": "SESSIONFORK_JOB_TTL",
    "job_timeout": "SESSIONFORK_JOB_TIMEOUT",
    "retries": "SESSIONFORK_RETRIES",
    "abandoned_after": "SESSIONFORK_ABANDONED_AFTER",
    "maintenance_interval": "SESSIONFORK_MAINTENANCE_INTERVAL",
    "worker_ttl": "SESSIONFORK_WORKER_TTL",
    "retention": "SESSIONFORK_RETENTION",
    "delete_after_persist": "SESSIONFORK_DELETE_AFTER_PERSIST",
    "wait_replicas": "SESSIONFORK_WAIT_REPLICAS",
    "wait_timeout_ms": "SESSIONFORK_WAIT_TIMEOUT_MS",
}


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


def from_environ(environ: Mapping[str, str], **overrides: Any) -> Settings:
    """Settings from ``environ`` (variables in ``ENV``), then ``overrides`` (flags; ``None`` = unset)."""
    raw: dict[str, Any] = {}
    for field, var in ENV.items():
        if environ.get(var):
            raw[field] = environ[var]
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid setting: {exc}") from None
    for field in ("max_request_bytes", "max_fanout", "max_event_bytes", "max_id_length", "outcome_ttl",
                  "job_ttl", "job_timeout", "abandoned_after", "maintenance_interval", "worker_ttl"):
        if getattr(settings, field) <= 0:
            raise ConfigError(f"{ENV[field]} must be positive, got {getattr(settings, field)}")
    if settings.retention < 0:
        raise ConfigError(f"SESSIONFORK_RETENTION must be 0 (off) or positive, got {settings.retention}")
    if settings.max_id_length > 128:
        raise ConfigError(f"SESSIONFORK_MAX_ID_LENGTH may only lower the id rule's 128, got {settings.max_id_length}")
    return settings
