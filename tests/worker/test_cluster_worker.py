"""The worker path with a cluster registry: a ``sessionfork worker --cluster`` process, its queue on
its own single server, forks a request onto the cluster, answers OPEN_TURN, and answers a retried
request with its first outcome (creating nothing more)."""

from __future__ import annotations

import signal
import uuid

import msgspec
import pytest
from cluster_fixtures import assert_no_crossslot, completed_source, session_ids
from helpers import SETTINGS
from rq.exceptions import StopRequested

from sessionfork.clients.client import Client
from sessionfork.core import keys
from sessionfork.core.connections import queue_client as connect_queue
from sessionfork.core.connections import registry_client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, Header, MergeResult, NewEvent, SelectResult
from sessionfork.embedded import EmbeddedCluster, EmbeddedServer
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.service import RequestService

pytestmark = pytest.mark.rq  # its stop handler test builds RQ's worker (run.py: again on RQ 2)

TIMEOUT = 60.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_worker_with_a_cluster_registry_forks_a_request(cluster_registry: Registry, queue_client: Client) -> None:
    completed_source(cluster_registry, "src", cwd="/w")
    reply = queue_client.fork("src", session_id="child", request_id=unique("req"), timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and isinstance(reply.session, Header), reply
    assert (reply.session.id, reply.session.parent_session, reply.session.seed_length, reply.session.cwd) == (
        "child", "src", 4, "/w")
    assert cluster_registry.events("child") == cluster_registry.events("src")
    assert cluster_registry.children("src") == ["child"]


def test_worker_with_a_cluster_registry_answers_open_turn(cluster_registry: Registry, queue_client: Client) -> None:
    handle = completed_source(cluster_registry, "src")
    cluster_registry.append(handle, [NewEvent("turn/start")])
    request_id = unique("req")
    reply = queue_client.fork("src", session_id="child", request_id=request_id, timeout=TIMEOUT)
    assert reply == ForkFailure(request_id=request_id, code="OPEN_TURN",
                                message='cannot fork session "src" inside an open turn (last event: turn/start)')
    assert not cluster_registry.exists("child")


def test_worker_with_a_cluster_registry_answers_a_retried_request_with_its_first_outcome(
    cluster: EmbeddedCluster, cluster_registry: Registry, queue_client: Client
) -> None:
    handle = completed_source(cluster_registry, "src")
    request_id = unique("req")
    first = queue_client.fork("src", session_id="child", request_id=request_id, timeout=TIMEOUT)
    assert first.ok, first
    cluster_registry.append(handle, [NewEvent("turn/start")])
    again = queue_client.fork("src", session_id="child", request_id=request_id, timeout=TIMEOUT)
    assert again == first
    assert cluster_registry.children("src") == ["child"]
    assert session_ids(cluster) == {"src", "child"}


def test_worker_with_a_cluster_registry_merges_and_selects_across_slots(cluster_registry: Registry,
                                                                         queue_client: Client) -> None:
    """A merge and a select through the worker, parent and children in different slots."""
    completed_source(cluster_registry, "src")
    fan = queue_client.fork("src", session_ids=["k0", "k1", "k2"], request_id=unique("req"), timeout=TIMEOUT)
    assert fan.ok, fan
    for cid in ("k0", "k1", "k2"):
        cluster_registry.append(cid, [NewEvent("turn/start"), NewEvent("turn/end")])
    slots = {cluster_registry.redis.keyslot(keys.session(s)) for s in ("src", "k0", "k1", "k2")}  # type: ignore[union-attr]
    assert len(slots) == 4
    merged = queue_client.merge("src", "k0", mode="events", request_id=unique("m"), timeout=TIMEOUT)
    assert isinstance(merged, MergeResult) and merged.length == 4 + 2 + 2 + 1, merged
    chosen = queue_client.select("src", ["k1", "k2"], "k2", mode="summary", summary={"t": 1},
                                 request_id=unique("s"), timeout=TIMEOUT)
    assert isinstance(chosen, SelectResult) and chosen.abandoned == ["k1"], chosen
    assert [cluster_registry.state_of(c).state for c in ("k0", "k1", "k2")] == ["merged", "abandoned", "merged"]
    assert cluster_registry.length("src") == 9 + 4


def test_the_stop_handler_of_a_cluster_worker_never_raises_and_ends_the_clusters_retries(
    cluster: EmbeddedCluster, queue_server: EmbeddedServer
) -> None:
    """SIGTERM's handler ends the retries of every client of the worker's, a ``RedisCluster``
    registry's included (its policy is not in connection keywords: the handler once raised
    ``AttributeError`` there, in a CI run mid-batch, and the worker never stopped)."""
    settings = msgspec.structs.replace(SETTINGS, cluster=True)
    registry_redis, queue_redis = registry_client(settings, cluster.url), connect_queue(settings, queue_server.url)
    try:
        svc = RequestService(Registry(registry_redis), Outcomes(queue_redis, ttl=60, stream_maxlen=100),
                          reply_channel="sf:replies", limits=Limits(max_fanout=16))
        worker = RequestWorker([jobs.make_queue(queue_redis, settings)], service=svc, connection=queue_redis,
                            abandoned_after=30)
        assert registry_redis.retry.get_retries() > 0  # type: ignore[union-attr]
        saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        raised: Exception | None = None
        try:
            worker.request_stop(signal.SIGTERM, None)  # what SIGTERM runs
        except Exception as exc:  # asserted below: a handler's error lands anywhere in the worker
            raised = exc
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        assert raised is None
        assert worker.stop_signalled
        assert registry_redis.retry.get_retries() == 0  # type: ignore[union-attr]  # halted
        assert queue_redis.get_retry().get_retries() == 0  # type: ignore[union-attr]
        with pytest.raises(StopRequested):  # the next safe point stops the loop
            worker.dequeue_job_and_maintain_ttl(1)
    finally:
        registry_redis.close()
        queue_redis.close()


def test_no_node_answered_crossslot_to_any_operation_of_the_module(cluster: EmbeddedCluster) -> None:
    """Last: every test of this module ran on this cluster (one per module); no node answered
    CROSSSLOT, failed a script but for NOSCRIPT, or rejected a command."""
    assert_no_crossslot(cluster)
