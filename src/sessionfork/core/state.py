"""What the registry's parts share: ``RegistryState``, one per ``registry.Registry``.

The parts (``logs.LogReader``, ``store.SessionStore``, ``deletion.Deleter``, ``fork_steps.ForkSteps``)
each hold the same state object: the connection and its scripts, the injected clock and id
factories, the limits and the replication wait, and the lineage cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from redis import Redis
from redis.cluster import RedisCluster

from ..core import keys, lua
from .factories import new_call_id, new_instance_token, new_session_id, now_ms

Lineage = tuple[int, tuple[tuple[str, int, int], ...]]
"""A session's seed length and its seed's resolved segments (they never change)."""


class RegistryOptions(TypedDict, total=False):
    """The keyword options of ``Registry(redis, ...)``: ``RegistryState``'s fields of the same names."""

    clock: Callable[[], int]
    new_id: Callable[[], str]
    new_token: Callable[[], str]
    new_call_id: Callable[[], str]
    max_event_bytes: int
    lifecycle_maxlen: int
    wait_replicas: int
    wait_timeout_ms: int
    compact_records: bool
    request_ttl: int
    max_merge_bytes: int


@dataclass(slots=True, eq=False)
class RegistryState:
    """One Redis connection (a ``Redis`` or a ``RedisCluster``) and what every part of a registry reads.

    ``clock`` returns Unix epoch milliseconds; ``new_id``, ``new_token`` and ``new_call_id`` make
    session ids, instance tokens and append-call ids. All are injected so tests can pin them.
    """

    redis: Redis | RedisCluster
    clock: Callable[[], int] = now_ms
    new_id: Callable[[], str] = new_session_id
    new_token: Callable[[], str] = new_instance_token
    new_call_id: Callable[[], str] = new_call_id
    max_event_bytes: int = 1024 * 1024
    lifecycle_maxlen: int = 1_000_000
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    compact_records: bool = True
    """Write records in the compact layout (``records``); False: the old one, for readers of an
    earlier version still running (``SESSIONFORK_COMPACT_RECORDS=0``)."""
    request_ttl: int = 24 * 3600
    """Seconds a merge's or a select's request id is remembered (its retry answers its first
    merge), and longest a request that died holds its sessions: the request window,
    ``SESSIONFORK_OUTCOME_TTL``. Past it, the same request id is a new request."""
    max_merge_bytes: int = 16 * 1024 * 1024
    """Most bytes of stored events one merge of mode ``events`` brings back
    (``SESSIONFORK_MAX_REQUEST_WRITE_BYTES``; ``INVALID_BOUNDARY`` beyond: merge in parts)."""
    scripts: lua.Scripts = field(init=False)
    cluster: bool = field(init=False)
    """On a single server the scripts append lifecycle events atomically with their change; on a
    cluster the stream lives in another slot, so the parts append them right after."""
    lifecycle_key: str | None = field(init=False)
    """The lifecycle stream as an optional script key: ``None`` on a cluster."""
    lineages: OrderedDict[str, Lineage] = field(init=False, default_factory=OrderedDict)
    """Seed length and resolved segments of the sessions read (at most ``logs.LINEAGE_CACHE``,
    the oldest dropped first)."""
    roots: OrderedDict[str, str] = field(init=False, default_factory=OrderedDict)
    """The tree root of the sessions appended to with usage ("": none; a session's root never
    changes), as the append script last named it (at most ``logs.LINEAGE_CACHE``)."""

    def __post_init__(self) -> None:
        self.cluster = isinstance(self.redis, RedisCluster)
        self.lifecycle_key = None if self.cluster else keys.LIFECYCLE_STREAM
        self.scripts = lua.Scripts(self.redis)

    def emit(self, client: Any, kind: str, sid: str, length: int) -> None:
        """Append a lifecycle event on ``client`` (the connection or a pipeline of it): a
        cluster's, right after the change it reports (the stream lives in another slot)."""
        client.xadd(keys.LIFECYCLE_STREAM, {"type": kind, "id": sid, "len": length},
                    maxlen=self.lifecycle_maxlen, approximate=True)
