"""A worker with a cluster registry goes on across a failover: requests submitted before the kill,
during the election and after the promotion all get exactly one outcome, and some request's
processing spans the kill and the promotion (it was queued before the kill, ended after it)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
from cluster_fixtures import running_cluster
from helpers import clean_environ, cli_args, make_client, outcome_entries, stop, turn, wait_registered, worker_name
from redis.cluster import RedisCluster
from rq.job import Job
from waits import wait_until

from sessionfork.core import keys, records
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

TIMEOUT = 60.0
BEFORE, AFTER = 200, 20
# At most this many submitted during the election: on a loaded machine the election can last long
# enough for an unbounded submitter to queue more than the worker drains within TIMEOUT.
DURING_MOST = 300


def role(node: EmbeddedServer) -> str:
    with node.client() as c:
        return str(c.info("replication")["role"])


@pytest.mark.slow
def test_a_cluster_worker_serves_every_request_across_a_primary_failover() -> None:
    with running_cluster() as cluster, EmbeddedServer() as queue_server:
        client = RedisCluster.from_url(cluster.url)
        registry = Registry(client)
        registry.append(registry.create("src"), turn(1))
        queue = queue_server.client()
        scheduler = make_client(queue)
        # A backlog queued before the worker starts: the kill lands while it is being worked off.
        before = [scheduler.submit(scheduler.request("src", session_id=f"b-{i}")) for i in range(BEFORE)]
        during: list[str] = []
        electing = threading.Event()

        def submit_during_the_election() -> None:
            while not electing.is_set() and len(during) < DURING_MOST:
                during.append(scheduler.submit(scheduler.request("src", session_id=f"d-{len(during)}")))

        name = worker_name("failover")
        worker = subprocess.Popen(
            cli_args(cluster.url, "--queue-url", queue_server.url, "--cluster", "worker", "--name", name,
                     "--log-level", "WARNING"), env=clean_environ(), stdin=subprocess.DEVNULL)
        submitter = threading.Thread(target=submit_during_the_election)
        try:
            wait_registered(queue, name, TIMEOUT)
            wait_until(lambda: queue.xlen(keys.OUTCOME_STREAM) >= 1, TIMEOUT, "the worker to be busy")
            owner = client.get_node_from_key(keys.session("src"))  # type: ignore[no-untyped-call]
            victim = next(i for i, m in enumerate(cluster.masters) if m.port == owner.port)
            killed_at = time.time()
            cluster.masters[victim].kill()  # while the backlog is being worked off
            submitter.start()
            promoted = cluster.replicas[victim]
            wait_until(lambda: role(promoted) == "master" and cluster.is_ok(), TIMEOUT, "the replica's promotion")
            promoted_at = time.time()
            electing.set()
            submitter.join(TIMEOUT)
            after = [scheduler.submit(scheduler.request("src", session_id=f"a-{i}")) for i in range(AFTER)]
            ids = [*before, *during, *after]
            marks = list(records.OUTCOME_MARKS)
            wait_until(lambda: all(any(queue.hmget(keys.request(r), marks)) for r in ids), TIMEOUT,
                       f"an outcome for each of {len(ids)} requests")
            assert worker.poll() is None, "the worker quit during the failover"
        finally:
            electing.set()
            if submitter.is_alive():
                submitter.join(TIMEOUT)
            assert stop(worker, TIMEOUT) == 0
        assert during, "no request was submitted during the election"
        per_request = Counter(e.request for e in outcome_entries(queue))
        assert {r: per_request[r] for r in ids} == dict.fromkeys(ids, 1)  # exactly one outcome each
        replies = {e.request: e.reply for e in outcome_entries(queue)}
        assert all(isinstance(replies[r], ForkResult) and replies[r].ok for r in ids), \
            {r: replies[r] for r in ids if not replies[r].ok}
        ended = {r: Job.fetch(r, connection=queue, serializer=jobs.JSONSerializer).ended_at for r in before}
        spanning = [r for r, at in ended.items() if at is not None and at.replace(tzinfo=UTC) >
                    datetime.fromtimestamp(promoted_at, UTC)]
        assert spanning, f"no request queued before the kill at {killed_at} ended after the promotion"
        queue.close()
        try:
            assert all(registry.exists(f"a-{i}") for i in range(AFTER))
        finally:
            client.close()
