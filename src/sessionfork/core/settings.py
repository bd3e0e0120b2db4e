"""The service's settings: every limit and timing (``Settings``, each with its default), the
variable that sets each (``ENV``) and the values allowed (``BOUNDS``, ``NAME_MAX_LENGTH``,
``ENQUEUE_MODES``). ``config`` reads them from an environment, checks them and re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from ..core import keys

REQUEST_LIMIT: Final = 64 * 1024
"""Largest request JSON, in bytes, the enqueue script takes (``protocol/scripts/enqueue.lua``'s
``MAX_REQUEST_BYTES``, pinned equal by a test): it refuses a larger one before reading it, on every
route (``FCALL``, ``EVALSHA``, ``EVAL``), so that no enqueue holds the queue server for long. The
workers' ``max_request_bytes`` may only lower it."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Service settings. Each field's environment variable is in ``ENV``."""

    redis_url: str | None = None
    """Registry server (``REDIS_URL``); ``rediss://`` for TLS, ``redis+sentinel://`` for a primary
    found through Sentinel. ``None``: the demo's embedded one."""
    queue_url: str | None = None
    """Queue server for RQ, outcomes and replies (``SESSIONFORK_QUEUE_URL``, any URL form of
    ``redis_url``); default: redis_url."""
    queue_urls: tuple[str, ...] | None = None
    """Sharded queue: one independent queue server per shard, in shard order
    (``SESSIONFORK_QUEUE_URLS``, comma-separated; each any URL form of ``redis_url``). A request
    lives on shard ``protocol.shards.shard_of(request_id, len(queue_urls))``. Excludes ``queue_url``."""
    shard: int | None = None
    """The shard a worker serves, 0-based (``SESSIONFORK_SHARD``); required by a worker when
    ``queue_urls`` lists more than one server."""
    cluster: bool = False
    """Registry is a Redis Cluster (``SESSIONFORK_CLUSTER=1``)."""
    tls_ca_file: str | None = None
    """CA bundle for ``rediss://`` connections (``SESSIONFORK_TLS_CA_FILE``)."""
    queue: str = keys.DEFAULT_QUEUE
    reply_channel: str = keys.DEFAULT_REPLY_CHANNEL
    max_request_bytes: int = REQUEST_LIMIT
    """Largest request payload accepted; larger is ``INVALID_REQUEST`` before any work (at most
    ``REQUEST_LIMIT``, what the enqueue script takes)."""
    max_fanout: int = 1024
    """Most children one request may create."""
    max_event_bytes: int = 1024 * 1024
    """Largest single event accepted on append."""
    max_id_length: int = 128
    """Longest session or request id a request may name (1-128; the id rule allows 128)."""
    max_request_write_bytes: int = 16 * 1024 * 1024
    """Most bytes of events one request may add to the registry: each child's edits and summary
    ``data`` (the JSON the request carries), summed over its children; more is ``INVALID_REQUEST``
    before any work. A request is at most ``max_request_bytes``, but a fan-out writes its edits
    once per child: 1024 children of 54 KB of edits would add 64 MB. 16 MiB lets the largest
    fan-out (1024) carry 16 KiB of edits per child (a long prompt), and every child a 64 KiB
    request can carry when it has 256 children or fewer. It also bounds the stored events one
    merge of mode ``events`` brings back (``INVALID_BOUNDARY``: merge the range in parts)."""
    outcome_ttl: int = 24 * 3600
    """Seconds an outcome (and so the idempotency of its request id) is kept: 24 h by default, the
    window payment APIs keep idempotency keys (Stripe), longer than any client's retry schedule.
    Also the request window of merges and selects (``Registry``'s ``request_ttl``)."""
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
    branch_ttl: int = 24 * 3600
    """Seconds a branch that ended (merged into an ancestor, or abandoned by a select) stays live
    before the workers' maintenance pass (and ``sessionfork gc``) disposes it; 0 = keep (never
    disposed for having ended). Once disposed, ``retention`` deletes it as any disposed session."""
    delete_after_persist: bool = False
    """Deletion waits for the persistence backend: a session is removed from Redis only once its
    JSONL file holds its whole log (``sessionfork persist`` running)."""
    wait_replicas: int = 0
    """Replicas that must acknowledge a fork before it is reported (WAIT), 0 = don't wait."""
    wait_timeout_ms: int = 1000
    """Milliseconds to wait for those replicas (WAIT's timeout; 0 would wait forever, so not allowed)."""
    socket_timeout: float = 5.0
    """Seconds a Redis command may take before it fails (a frozen server): every client's
    ``socket_timeout``. RQ raises it on the worker's own connection to cover its blocking dequeue."""
    connect_timeout: float = 3.0
    """Seconds a connection to Redis may take to open (TCP and TLS handshake)."""
    compact_records: bool = True
    """Write session and request records in the compact layout (``SESSIONFORK_COMPACT_RECORDS``;
    ``core.records``): small fields, so that Redis keeps them as listpacks at its default
    ``hash-max-listpack-value``. ``0`` writes the old layout (one JSON ``header``, one JSON
    ``outcome``), for a rolling upgrade while workers or clients of an earlier version still read
    the records; every version since reads both."""
    metrics_address: str = "0.0.0.0"
    """The address a worker serves its Prometheus metrics on (``SESSIONFORK_METRICS_ADDRESS``, ``worker
    --metrics-address``; the port is ``--metrics-port``): an IPv4 or IPv6 address or a host name;
    ``127.0.0.1`` keeps them on the host, ``::`` takes IPv6 too."""
    enqueue: str = "auto"
    """How the clients run the enqueue script (``SESSIONFORK_ENQUEUE``): ``auto`` = ``FCALL`` of the
    loaded ``sessionfork`` library, else ``EVALSHA``; ``fcall`` = the library only; ``eval`` = never
    the library (``protocol.enqueue``)."""
    batch: int = 32
    """Most queued requests a worker takes in one round trip when more than one waits
    (``SESSIONFORK_BATCH``; 1 = one at a time). A batch's forks (within
    ``batch_children``) and merges run together: one round trip for RQ's start of them all and all
    their claims, one for all their children, one transaction for all their records and RQ's finish
    (docs/performance.md#batches). A lone request never waits for a batch to fill."""
    batch_children: int = 256
    """Most children the forks of one batch create (``SESSIONFORK_BATCH_CHILDREN``): the requests
    one take holds run in batches, in queue order; a fan-out joins the batch while its children
    fit in what is left (a plain fork counts one), else it starts the next batch. A fan-out of more
    children than this runs as a batch of its own after the batches, so that it never holds their replies."""


ENV: Mapping[str, str] = {
    "redis_url": "REDIS_URL",
    "queue_url": "SESSIONFORK_QUEUE_URL",
    "queue_urls": "SESSIONFORK_QUEUE_URLS",
    "shard": "SESSIONFORK_SHARD",
    "cluster": "SESSIONFORK_CLUSTER",
    "tls_ca_file": "SESSIONFORK_TLS_CA_FILE",
    "queue": "SESSIONFORK_QUEUE",
    "reply_channel": "SESSIONFORK_REPLY_CHANNEL",
    "max_request_bytes": "SESSIONFORK_MAX_REQUEST_BYTES",
    "max_fanout": "SESSIONFORK_MAX_FANOUT",
    "max_event_bytes": "SESSIONFORK_MAX_EVENT_BYTES",
    "max_id_length": "SESSIONFORK_MAX_ID_LENGTH",
    "max_request_write_bytes": "SESSIONFORK_MAX_REQUEST_WRITE_BYTES",
    "outcome_ttl": "SESSIONFORK_OUTCOME_TTL",
    "outcome_stream_maxlen": "SESSIONFORK_OUTCOME_STREAM_MAXLEN",
    "job_ttl": "SESSIONFORK_JOB_TTL",
    "job_timeout": "SESSIONFORK_JOB_TIMEOUT",
    "retries": "SESSIONFORK_RETRIES",
    "abandoned_after": "SESSIONFORK_ABANDONED_AFTER",
    "maintenance_interval": "SESSIONFORK_MAINTENANCE_INTERVAL",
    "worker_ttl": "SESSIONFORK_WORKER_TTL",
    "retention": "SESSIONFORK_RETENTION",
    "branch_ttl": "SESSIONFORK_BRANCH_TTL",
    "delete_after_persist": "SESSIONFORK_DELETE_AFTER_PERSIST",
    "wait_replicas": "SESSIONFORK_WAIT_REPLICAS",
    "wait_timeout_ms": "SESSIONFORK_WAIT_TIMEOUT_MS",
    "socket_timeout": "SESSIONFORK_SOCKET_TIMEOUT",
    "connect_timeout": "SESSIONFORK_CONNECT_TIMEOUT",
    "enqueue": "SESSIONFORK_ENQUEUE",
    "compact_records": "SESSIONFORK_COMPACT_RECORDS",
    "metrics_address": "SESSIONFORK_METRICS_ADDRESS",
    "batch": "SESSIONFORK_BATCH",
    "batch_children": "SESSIONFORK_BATCH_CHILDREN",
}

_DAY = 24 * 3600
BOUNDS: Mapping[str, tuple[float, float]] = {
    "max_request_bytes": (1, REQUEST_LIMIT),  # may only lower the enqueue script's limit
    "max_fanout": (1, 100_000),
    "max_event_bytes": (1, 512 * 1024 * 1024),
    "max_id_length": (1, 128),  # may only lower the id rule's 128
    "max_request_write_bytes": (1, 2**40),  # 1 TiB: more than any server holds (no bound at all)
    "outcome_ttl": (1, 3650 * _DAY),
    "outcome_stream_maxlen": (1, 10**12),
    "job_ttl": (1, 3650 * _DAY),
    "retention": (0, 3650 * _DAY),  # 0: off
    "branch_ttl": (0, 3650 * _DAY),  # 0: keep ended branches live
    "job_timeout": (1, 7 * _DAY),
    "retries": (0, 1000),
    "abandoned_after": (1, _DAY),
    "maintenance_interval": (1, _DAY),
    "worker_ttl": (1, _DAY),
    "wait_replicas": (0, 100),
    "wait_timeout_ms": (1, 600_000),
    "socket_timeout": (0.1, 3600),
    "connect_timeout": (0.1, 3600),
    "batch": (1, 1024),
    "batch_children": (1, 100_000),
}
"""The range of every numeric setting, inclusive; any value outside it is a ``ConfigError``."""
NAME_MAX_LENGTH = 256
ENQUEUE_MODES = ("auto", "fcall", "eval")
