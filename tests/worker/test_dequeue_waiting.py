"""An idle worker's wait for a job reads the job's hash in the wait's own round trip
(``SeamWorker._dequeue_waiting``: BLMOVE pipelined with ``scripts/last.lua``), uses that hash only
for the entry the BLMOVE moved (another worker's move may land between the two), and starts at
once, with no take, when the last finish saw the queue empty."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import pytest
from helpers import queue_of
from redis import Redis
from waits import wait_until

from sessionfork import NewEvent, Registry
from sessionfork.clients.client import Client
from sessionfork.core.config import Settings
from sessionfork.core.wire import ForkResult
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.rq_seam.entries import DequeuedJob, Taken
from sessionfork.worker.service import RequestService

pytestmark = pytest.mark.rq

TURN = [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})]


class Watched(RequestWorker):
    """Counts every ``take`` (those that found nothing too) and every job fetched as RQ fetches
    it (its hash read in a round trip of its own)."""

    takes: ClassVar[int] = 0
    fetched: ClassVar[list[str]] = []

    batches: ClassVar[list[list[str]]] = []

    def take(self, count: int) -> Taken:
        Watched.takes += 1
        return super().take(count)

    def run_batch(self, jobs: list[Any], queue: Any) -> None:
        Watched.batches.append([job.id for job in jobs])
        super().run_batch(jobs, queue)


def _worker(redis: Redis, registry: Registry, batch: int, monkeypatch: pytest.MonkeyPatch) -> Watched:
    Watched.takes, Watched.fetched, Watched.batches = 0, [], []
    fetch = DequeuedJob.fetch.__func__  # type: ignore[attr-defined]

    def fetched(cls: Any, job_id: str, *args: Any, **kwargs: Any) -> Any:
        Watched.fetched.append(job_id)
        return fetch(cls, job_id, *args, **kwargs)

    monkeypatch.setattr(DequeuedJob, "fetch", classmethod(fetched))
    service = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    return Watched([jobs.make_queue(redis, Settings())], service=service, connection=redis, abandoned_after=30,
                   batch=batch)


def _blocked(redis: Redis) -> bool:
    """The worker's connection is blocked (CLIENT LIST flag ``b``) in its BLMOVE."""
    return any("b" in c["flags"] and c["cmd"] == "blmove" for c in redis.client_list())


def _child(redis: Redis, request_id: str) -> str | None:
    reply = Outcomes(redis, ttl=600, stream_maxlen=10).get(request_id)
    return reply.child.id if isinstance(reply, ForkResult) else None


def _in_thread(work: Any) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("batch", [1, 32])
def test_a_lone_job_comes_with_its_hash_in_the_waits_round_trip_and_no_take_first(
        redis: Redis, registry: Registry, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    client.submit(client.request("src", session_id="first-child", request_id="first"))
    worker = _worker(redis, registry, batch, monkeypatch)

    def submit_once_blocked() -> None:
        wait_until(lambda: _blocked(redis), 30, "the worker blocked in its wait")
        client.submit(client.request("src", session_id="lone-child", request_id="lone"))

    helper = _in_thread(submit_once_blocked)
    assert worker.work(burst=False, logging_level="WARNING", max_jobs=2) is True
    helper.join(30)
    assert _child(redis, "first") == "first-child" and _child(redis, "lone") == "lone-child"
    assert Watched.fetched == []  # each job built from the hash read with its move: no fetch of its own
    # The first job's finish saw the queue empty: the next dequeue was the wait itself, no take
    # (with batches, the first dequeue's take found the first job; one at a time, none ever).
    assert Watched.takes == (1 if batch > 1 else 0)


@pytest.mark.parametrize("batch", [1, 32])
def test_an_entry_moved_behind_the_waits_never_lends_its_hash(
        redis: Redis, registry: Registry, batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race made to happen: the BLMOVE that wakes the worker is served right after the command
    that pushes the worker's entry; the pushing client's next command, in the same pipeline, puts
    another job's entry behind it before the worker's script reads the intermediate queue's last
    entry. The worker must run its own entry's payload (its hash fetched as RQ does)."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    queue = queue_of(client)
    for name in ("mine", "other"):
        client.submit(client.request("src", session_id=f"{name}-child", request_id=name))
    assert redis.delete(queue.key) == 1  # both jobs' hashes stay; their entries are pushed below
    worker = _worker(redis, registry, batch, monkeypatch)

    def push_once_blocked() -> None:
        wait_until(lambda: _blocked(redis), 30, "the worker blocked in its wait")
        pipe = redis.pipeline(transaction=False)
        pipe.rpush(queue.key, "mine")
        pipe.rpush(queue.intermediate_queue_key, "other")  # another worker's move, in between
        pipe.execute()

    helper = _in_thread(push_once_blocked)
    began = time.monotonic()
    assert worker.work(burst=False, logging_level="WARNING", max_jobs=1) is True
    helper.join(30)
    assert time.monotonic() - began < 30
    assert redis.lrange(queue.intermediate_queue_key, 0, -1) == [b"other"]  # the race happened: behind "mine"
    assert Watched.fetched == ["mine"]  # the hash read with the wait was another entry's: not used
    assert _child(redis, "mine") == "mine-child" and _child(redis, "other") is None


def test_the_requests_that_arrive_with_the_one_that_wakes_a_batched_worker_join_its_batch(
        redis: Redis, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait's round trip also takes up to ``batch - 1`` more entries: three pushed at once to a
    blocked worker run as one batch (the first moved by the BLMOVE, the others by the take)."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    queue = queue_of(client)
    names = ["a", "b", "c"]
    for name in names:
        client.submit(client.request("src", session_id=f"{name}-child", request_id=name))
    assert redis.delete(queue.key) == 1  # the hashes stay; the entries are pushed below, at once
    worker = _worker(redis, registry, 32, monkeypatch)

    def push_once_blocked() -> None:
        wait_until(lambda: _blocked(redis), 30, "the worker blocked in its wait")
        redis.rpush(queue.key, *names)  # one command: the BLMOVE is served after it, with b and c queued

    helper = _in_thread(push_once_blocked)
    assert worker.work(burst=False, logging_level="WARNING", max_jobs=3) is True
    helper.join(30)
    assert Watched.batches == [names]  # one batch: woken by a, b and c taken with it
    # One take of its own: the first dequeue's, which found the queue empty before the wait.
    assert Watched.takes == 1 and Watched.fetched == []
    assert [_child(redis, name) for name in names] == [f"{name}-child" for name in names]
    assert redis.llen(queue.intermediate_queue_key) == 0
