"""Failover while forks run, in the library, on a Redis Cluster (3 primaries, 1 replica each; one
started per test): forks go on after the source's primary is SIGKILLed and its replica promoted;
without WAIT few acknowledged children are lost, with ``wait_replicas`` none is. (The worker's
failover is test_cluster_failover_worker.py.)"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from cluster_fixtures import completed_source, running_cluster
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, ClusterError, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from waits import wait_until

from sessionfork.core import forks, keys
from sessionfork.core.lua import NotReplicated
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Header
from sessionfork.embedded import EmbeddedServer

TIMEOUT = 60.0
FAILOVER_FORKS_BEFORE = 30
FAILOVER_FORKS_AFTER = 30
FAILOVER_MAX_FORKS = 5_000
FAILOVER_MAX_ATTEMPTS = 5_000
MAX_LOST_WITHOUT_WAIT = 5
RETRYABLE = (RedisConnectionError, RedisTimeoutError, ClusterDownError, ClusterError, SlotNotCoveredError,
             NotReplicated)


# -- failover while forks run ----------------------------------------------------------------------


class Forker(threading.Thread):
    """Forks ``source`` into fo-0, fo-1, ... (request ids req-0, ...), each retried until it succeeds."""

    def __init__(self, registry: Registry, source: str) -> None:
        super().__init__(daemon=True)
        self.registry = registry
        self.source = source
        self.acked: list[Header] = []
        self.retries: Counter[str] = Counter()
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            for i in range(FAILOVER_MAX_FORKS):
                if self.halt.is_set():
                    return
                self.acked.append(self._fork(f"fo-{i}", f"req-{i}"))
        except BaseException as exc:
            self.error = exc

    def _fork(self, child: str, request_id: str) -> Header:
        deadline = time.monotonic() + TIMEOUT
        for _ in range(FAILOVER_MAX_ATTEMPTS):
            try:
                return forks.fork(self.registry, self.source, child, request_id=request_id)
            except RETRYABLE as exc:
                self.retries[type(exc).__name__] += 1
                if time.monotonic() > deadline:
                    raise
        raise AssertionError(f"{request_id}: no success in {FAILOVER_MAX_ATTEMPTS} attempts")

    def successes(self) -> int:
        if self.error is not None:
            raise AssertionError(f"forker failed: {self.error!r}") from self.error
        return len(self.acked)


def role(node: EmbeddedServer) -> str:
    with node.client() as c:
        return str(c.info("replication")["role"])


def link_up(node: EmbeddedServer) -> bool:
    with node.client() as c:
        info = c.info("replication")
    return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")


def caught_up(master: EmbeddedServer) -> bool:
    """The primary's replicas have acknowledged everything it has written."""
    with master.client() as c:
        info = c.info("replication")
    offsets = [v["offset"] for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return bool(offsets) and min(offsets) >= info["master_repl_offset"]


@dataclass(frozen=True)
class Failover:
    """What a failover run saw: acknowledged children, those missing afterwards, those missing
    from the source's children index, and retries per error type."""

    acked: int
    missing: list[str]
    unindexed: int
    retries: dict[str, int]

    def __str__(self) -> str:
        return (f"{self.acked} acknowledged forks, {len(self.missing)} lost {self.missing}, {self.unindexed} not "
                f"in the children index, retries {self.retries}")


def failover_while_forking(wait_replicas: int) -> Failover:
    """Fork continuously, SIGKILL the source's primary, wait for its replica's promotion, fork on.

    With ``wait_replicas``, the killed node is restarted once the replica took over, so that the new
    primary has a replica to acknowledge the forks.
    """
    with running_cluster() as cluster:
        client = RedisCluster.from_url(cluster.url)
        forker: Forker | None = None
        try:
            registry = Registry(client, wait_replicas=wait_replicas, wait_timeout_ms=500)
            completed_source(registry, "src")
            owner = client.get_node_from_key(keys.session("src"))  # type: ignore[no-untyped-call]
            victim = next(i for i, m in enumerate(cluster.masters) if m.port == owner.port)
            wait_until(lambda: caught_up(cluster.masters[victim]), TIMEOUT, "the source to reach its replica")
            forker = Forker(registry, "src")
            forker.start()
            wait_until(lambda: forker.successes() >= FAILOVER_FORKS_BEFORE, TIMEOUT, "forks before the kill")
            cluster.masters[victim].kill()
            promoted = cluster.replicas[victim]
            wait_until(lambda: role(promoted) == "master" and cluster.is_ok(), TIMEOUT, "the replica's promotion")
            if wait_replicas:
                cluster.masters[victim].start()
                wait_until(lambda: link_up(cluster.masters[victim]), TIMEOUT, "the old primary to rejoin as replica")
            after = forker.successes()
            wait_until(lambda: forker.successes() >= after + FAILOVER_FORKS_AFTER, TIMEOUT, "forks after failover")
            forker.halt.set()
            forker.join(TIMEOUT)
            assert not forker.is_alive()
            assert forker.error is None, repr(forker.error)
            reader = Registry(client)
            source = reader.events("src")
            missing = []
            for header in forker.acked:
                if not reader.exists(header.id):
                    missing.append(header.id)
                    continue
                assert isinstance(header.seed_length, int), header
                assert reader.events(header.id) == source[: header.seed_length], header.id
            indexed = set(reader.children("src"))
            return Failover(acked=len(forker.acked), missing=missing, retries=dict(forker.retries),
                            unindexed=sum(1 for h in forker.acked if h.id not in indexed))
        finally:
            if forker is not None:
                forker.halt.set()
                forker.join(TIMEOUT)
            client.close()


@pytest.mark.slow
def test_forks_go_on_after_the_sources_primary_is_killed_and_few_acknowledged_children_are_lost() -> None:
    seen = failover_while_forking(wait_replicas=0)
    print(f"\nfailover without WAIT: {seen}")
    assert seen.acked >= FAILOVER_FORKS_BEFORE + FAILOVER_FORKS_AFTER
    assert len(seen.missing) <= MAX_LOST_WITHOUT_WAIT, seen
    assert seen.unindexed <= MAX_LOST_WITHOUT_WAIT, seen  # an index entry is an acknowledged write too


@pytest.mark.slow
def test_with_wait_replicas_no_acknowledged_child_is_lost_across_a_failover() -> None:
    seen = failover_while_forking(wait_replicas=1)
    print(f"\nfailover with WAIT 1: {seen}")
    assert seen.acked >= FAILOVER_FORKS_BEFORE + FAILOVER_FORKS_AFTER
    assert seen.missing == [], seen
    assert seen.unindexed == 0, seen  # the parent's index entry is waited for too
