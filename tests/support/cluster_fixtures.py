"""Redis Cluster fixtures for the cluster tests: one 3-master/1-replica cluster per module, and the
helpers the ``test_cluster_*.py`` modules share (a completed source, session ids, lineage edges).

The fixtures are registered under the names ``cluster``, ``cluster_client`` and ``cluster_registry``,
and, for a worker whose registry is the cluster, ``queue_server``, ``cluster_worker`` and
``queue_client``; the conftest.py of the folders that use them imports them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from helpers import clean_environ, cli_args, make_client, stop, turn, wait_registered, worker_name
from redis.cluster import RedisCluster
from waits import wait_until

from sessionfork.clients.client import Client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import LiveHandle
from sessionfork.embedded import EmbeddedCluster, EmbeddedServer
from sessionfork.ops import lineage

START_TIMEOUT = 60.0


class FastSyncCluster(EmbeddedCluster):
    """An ``EmbeddedCluster`` whose primaries start a replica's full sync at once (no 5 s delay).

    ``close()`` stops every node ever made, also those of a start that failed half-way.
    """

    def __init__(self, masters: int, replicas: int) -> None:
        super().__init__(masters, replicas)
        self.made: list[EmbeddedServer] = []

    def node_args(self) -> list[str]:
        return ["--repl-diskless-sync-delay", "0"]

    def _node(self) -> EmbeddedServer:
        node = super()._node()
        self.made.append(node)
        return node

    def close(self) -> None:
        for node in self.made:
            node.close()


def replicas_in_sync(cluster: EmbeddedCluster) -> bool:
    """Every running replica has its link to its primary up and the cluster reports ok."""
    for node in cluster.replicas:
        if node.process is None or node.process.poll() is not None:
            continue
        with node.client() as c:
            info = c.info("replication")
        if info.get("role") != "slave" or info.get("master_link_status") != "up":
            return False
    return cluster.is_ok()


@contextmanager
def running_cluster(masters: int = 3, replicas: int = 1) -> Iterator[EmbeddedCluster]:
    """A started cluster with replicas in sync; every node is stopped on exit, even a failed start."""
    cluster = FastSyncCluster(masters, replicas)
    try:
        cluster.start(START_TIMEOUT)
        wait_until(lambda: replicas_in_sync(cluster), START_TIMEOUT, "replicas to sync with their primaries")
        yield cluster
    finally:
        cluster.close()


def flush_masters(cluster: EmbeddedCluster) -> None:
    """``FLUSHALL`` on every running primary (replicas follow)."""
    for node in cluster.masters:
        if node.process is not None and node.process.poll() is None:
            with node.client() as c:
                c.flushall()


@pytest.fixture(scope="module", name="cluster")
def cluster_fixture() -> Iterator[EmbeddedCluster]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module", name="cluster_client")
def cluster_client_fixture(cluster: EmbeddedCluster) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster.url)
    yield client
    client.close()


@pytest.fixture(name="cluster_registry")
def cluster_registry_fixture(cluster: EmbeddedCluster, cluster_client: RedisCluster) -> Registry:
    """A registry on the module's cluster, every primary flushed first."""
    flush_masters(cluster)
    return Registry(cluster_client)


@pytest.fixture(scope="module", name="queue_server")
def queue_server_fixture() -> Iterator[EmbeddedServer]:
    """The queue's own single server (RQ, outcomes, replies); never flushed, ids are unique."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture(scope="module", name="cluster_worker")
def cluster_worker_fixture(cluster: EmbeddedCluster, queue_server: EmbeddedServer) -> Iterator[subprocess.Popen[bytes]]:
    """A ``sessionfork worker --cluster`` process on the module's cluster, its queue on ``queue_server``."""
    name = worker_name("cluster")
    proc = subprocess.Popen(
        cli_args(cluster.url, "--queue-url", queue_server.url, "--cluster", "worker", "--name", name,
                 "--log-level", "WARNING"),
        env=clean_environ(), stdin=subprocess.DEVNULL)
    try:
        with queue_server.client() as probe:
            wait_registered(probe, name, START_TIMEOUT)
        yield proc
    finally:
        assert stop(proc) == 0


@pytest.fixture(name="queue_client")
def queue_client_fixture(queue_server: EmbeddedServer, cluster_worker: subprocess.Popen[bytes]) -> Iterator[Client]:
    """A client of ``cluster_worker``'s queue (the worker still running)."""
    assert cluster_worker.poll() is None, f"the cluster worker exited with {cluster_worker.returncode}"
    redis = queue_server.client()
    yield make_client(redis)
    redis.close()


# -- helpers ---------------------------------------------------------------------------------------


def completed_source(registry: Registry, sid: str = "src", cwd: str | None = None) -> LiveHandle:
    """A live session with one finished turn (4 events)."""
    handle = registry.create(sid, cwd=cwd)
    registry.append(handle, turn(1))
    return handle


def session_ids(cluster: EmbeddedCluster) -> set[str]:
    """Ids of every session record on the cluster's primaries (logs and children sets excluded)."""
    found: set[str] = set()
    for node in cluster.masters:
        with node.client() as c:
            for key in c.scan_iter(match="sf:s:*", count=1000):
                text = key.decode()
                if text.endswith("}"):
                    found.add(text[len("sf:s:{"):-1])
    return found


def edges(tree: lineage.Lineage) -> list[tuple[str, str]]:
    """Every (parent, child) pair under the lineage's root, depth first."""
    out: list[tuple[str, str]] = []

    def walk(node: lineage.Node) -> None:
        for child in node.children:
            out.append((node.id, child.id))
            walk(child)

    walk(tree.root)
    return out


SCRIPT_COMMANDS = ("cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro")


def assert_no_crossslot(cluster: EmbeddedCluster) -> None:
    """No node of ``cluster`` answered CROSSSLOT, failed a script but for NOSCRIPT, or rejected a
    command, since it started (a module's cluster: every operation of the module's tests)."""
    for node in cluster.nodes:
        with node.client() as c:
            errors = c.info("errorstats")
            commands = c.info("commandstats")
        assert "errorstat_CROSSSLOT" not in errors, (node.port, errors)
        # A script touching another slot fails with an ERR; the only failures allowed are NOSCRIPT
        # (first call of a script on a node), and no command may have been rejected (CROSSSLOT is).
        noscript = errors.get("errorstat_NOSCRIPT", {}).get("count", 0)
        failed = sum(commands.get(name, {}).get("failed_calls", 0) for name in SCRIPT_COMMANDS)
        assert failed == noscript, (node.port, errors, {k: commands[k] for k in SCRIPT_COMMANDS if k in commands})
        rejected = {name: s["rejected_calls"] for name, s in commands.items() if s.get("rejected_calls")}
        assert rejected == {}, (node.port, rejected)
