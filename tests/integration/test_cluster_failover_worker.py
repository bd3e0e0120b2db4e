"""A worker with a cluster registry goes on across a failover: every request still gets its outcome."""

from __future__ import annotations

import subprocess

import pytest
from cluster_fixtures import running_cluster
from helpers import clean_environ, cli_args, make_client, stop, turn, wait_registered, worker_name
from redis.cluster import RedisCluster

from sessionfork.core import keys
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult
from sessionfork.embedded import EmbeddedServer, wait_until

TIMEOUT = 60.0
BEFORE, AFTER = 20, 20


def role(node: EmbeddedServer) -> str:
    with node.client() as c:
        return str(c.info("replication")["role"])


@pytest.mark.slow
def test_a_cluster_worker_serves_every_request_across_a_primary_failover() -> None:
    with running_cluster() as cluster, EmbeddedServer() as queue_server:
        client = RedisCluster.from_url(cluster.url)
        registry = Registry(client)
        registry.append(registry.create("src"), turn(1))
        name = worker_name("failover")
        worker = subprocess.Popen(
            cli_args(cluster.url, "--queue-url", queue_server.url, "--cluster", "worker", "--name", name,
                     "--log-level", "WARNING"), env=clean_environ(), stdin=subprocess.DEVNULL)
        queue = queue_server.client()
        try:
            wait_registered(queue, name, TIMEOUT)
            scheduler = make_client(queue)
            before = [scheduler.submit(scheduler.request("src", session_id=f"b-{i}")) for i in range(BEFORE)]
            owner = client.get_node_from_key(keys.session("src"))  # type: ignore[no-untyped-call]
            victim = next(i for i, m in enumerate(cluster.masters) if m.port == owner.port)
            cluster.masters[victim].kill()  # while the first requests are in flight
            promoted = cluster.replicas[victim]
            wait_until(lambda: role(promoted) == "master" and cluster.is_ok(), TIMEOUT, "the replica's promotion")
            after = [scheduler.submit(scheduler.request("src", session_id=f"a-{i}")) for i in range(AFTER)]
            replies = {rid: scheduler.wait(scheduler.request("src", request_id=rid,
                                                             session_id=f"{'b' if rid in before else 'a'}-{n}"),
                                           TIMEOUT)
                       for n, rid in [*enumerate(before), *enumerate(after)]}
            assert worker.poll() is None, "the worker quit during the failover"
        finally:
            assert stop(worker, TIMEOUT) == 0
            queue.close()
        assert len(replies) == BEFORE + AFTER
        assert all(isinstance(r, ForkResult) and r.ok for r in replies.values()), \
            {rid: r for rid, r in replies.items() if not r.ok}
        reader = Registry(RedisCluster.from_url(cluster.url))
        assert all(reader.exists(f"a-{i}") for i in range(AFTER))
        client.close()
