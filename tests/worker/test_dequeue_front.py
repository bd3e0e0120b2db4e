"""The worker reads the next job's hash in its dequeue's round trip, from the queue entry its last
finish saw at the queue's front: the hash read is used only for that very entry (another worker
may have taken it meanwhile), and a bad entry is refused with an outcome as RQ's dequeue's are."""

from __future__ import annotations

from typing import Any, ClassVar

from helpers import outcome_entries, queue_of
from redis import Redis

from sessionfork import NewEvent, Registry
from sessionfork.clients.client import Client
from sessionfork.core.config import Settings
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.service import RequestService

TURN = [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})]


class FrontTakenByAnother(RequestWorker):
    """After its first job, another worker takes the entry this one saw at the queue's front."""

    taken: ClassVar[list[bytes]] = []

    def finished(self, replies: list[Any], jobs: int, worked: float, last: bool = True) -> None:
        super().finished(replies, jobs, worked, last)
        if not self.taken and self._front is not None:
            assert self.connection.lrem(self.queues[0].key, 1, self._front) == 1
            self.taken.append(self._front)


def _service(redis: Redis, registry: Registry) -> RequestService:
    return RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                       limits=Limits(max_fanout=16))


def test_a_front_entry_taken_by_another_worker_never_lends_its_hash(redis: Redis, registry: Registry) -> None:
    """One request at a time (``SESSIONFORK_BATCH=1``): only then does a finish read the entry at
    the queue's front for the next dequeue to take with its hash (with batches, a finish reads
    only whether one waits)."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    ids = [client.submit(client.request("src", session_id=f"child-{i}", request_id=f"front-{i}")) for i in range(3)]
    service = _service(redis, registry)
    worker = FrontTakenByAnother([jobs.make_queue(redis, Settings())], service=service, connection=redis,
                                 abandoned_after=30, batch=1)
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert worker.taken == [b"front-1"]  # the race happened: the worker's hint was gone
    redis.rpush(queue_of(client).key, b"front-1")  # the other worker gave it back
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    for i, request_id in enumerate(ids):  # each request ran its own payload: its own child
        reply = service.outcomes.get(request_id)
        assert isinstance(reply, ForkResult) and reply.session is not None, reply
        assert reply.session.id == f"child-{i}"
    assert sorted(e.request for e in outcome_entries(redis)) == ids


def test_a_bad_entry_at_the_front_is_refused_with_an_outcome(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    first = client.submit(client.request("src", session_id="ok-child", request_id="good-1"))
    redis.rpush(queue_of(client).key, b"no-such-job", b"bad:id", b"\xff\xfe")  # after it: the front at its finish
    service = _service(redis, registry)
    worker = RequestWorker([jobs.make_queue(redis, Settings())], service=service, connection=redis, abandoned_after=30)
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert isinstance(service.outcomes.get(first), ForkResult)
    for entry in (b"no-such-job", b"bad:id", b"\xff\xfe"):
        raw = redis.hget(b"sf:req:" + entry, "outcome")
        assert raw is not None, entry
    refused = service.outcomes.get("no-such-job")
    assert isinstance(refused, ForkFailure) and refused.code == "INVALID_REQUEST"
    assert redis.llen(queue_of(client).key) == 0 and redis.llen(queue_of(client).intermediate_queue_key) == 0
