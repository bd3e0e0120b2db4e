"""A worker whose success bookkeeping fails mid-way (the primary died with the pipeline in flight,
and the promoted replica lacks the job's execution record, as in a Sentinel failover) runs it
again and goes on: it never drops the job's execution on the first try nor quits on the retry."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import msgspec
import pytest
from helpers import outcome_entries
from monitoring import Command, monitored, transaction_of
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rq.job import Job

from sessionfork import NewEvent, Registry
from sessionfork.clients.client import Client
from sessionfork.core import keys
from sessionfork.core.config import Settings
from sessionfork.core.wire import ForkFailure
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.fork_worker import ForkWorker
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.service import ForkService

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)


class PrimaryDiesInFinish(ForkWorker):
    """The first success pipeline fails after the job's finish (the execution's clean-up in it)
    was queued in it."""

    failed_finishes = 0

    def finish_many(self, jobs: Any, queue: Any, results: Any, executions: Any, pipe: Any) -> float:
        worked = super().finish_many(jobs, queue, results, executions, pipe)
        if self.failed_finishes:
            return worked

        def primary_dies(*_: Any, **__: Any) -> None:
            self.failed_finishes += 1
            # The promoted replica never got the start's writes: RQ 3's worker then has no
            # execution to fall back on but the one it holds (RQ 2 has no such index).
            if hasattr(self, "executions_key"):
                self.connection.delete(self.executions_key)
            raise RedisConnectionError("the primary went away with the pipeline in flight")

        pipe.execute = primary_dies
        return worked


@pytest.mark.parametrize("kept", [False, True], ids=["ledger", "kept-for-ever"])
def test_a_finish_that_failed_mid_pipeline_is_run_again_and_the_worker_goes_on(redis: Redis, registry: Registry,
                                                                              kept: bool) -> None:
    """Both finishes: the ledger's (a fork job's) and RQ's own methods' (a job whose result is kept
    for ever: RQ's ``cleanup_execution`` drops the worker's execution before the pipeline runs)."""
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    ids = [client.submit(client.request("src", session_id=f"c{i}-{kept}")) for i in range(2)]
    if kept:
        for request_id in ids:
            redis.hset(f"rq:job:{request_id}", "result_ttl", -1)
    service = ForkService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    worker = PrimaryDiesInFinish([jobs.make_queue(redis, Settings())], service=service, connection=redis,
                                 abandoned_after=30)
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert worker.failed_finishes == 1  # the failure happened
    assert [Job.fetch(r, connection=redis, serializer=jobs.JSONSerializer).get_status() for r in ids] == \
        ["finished", "finished"]
    assert [service.outcomes.get(r).ok for r in ids] == [True, True]  # type: ignore[union-attr]
    assert jobs.make_queue(redis, Settings()).started_job_registry.count == 0  # nothing left started


STUCK_AFTER = 20.0
"""Seconds after which a worker still retrying a server's lost scripts is deemed stuck (the two jobs
take about a second)."""

class ScriptsLostBeforeEachRecord(Outcomes):
    """The queue server loses its scripts (a restart, SCRIPT FLUSH) right before each outcome's
    record: the record's transaction, which carries RQ's success bookkeeping, meets an empty cache."""

    flushes = 0

    def _record_then(self, reply: Any, call: Any, then: Any) -> Any:
        self.redis.script_flush()
        ScriptsLostBeforeEachRecord.flushes += 1
        return super()._record_then(reply, call, then)


def test_the_finish_never_runs_without_the_outcome_when_the_server_lost_its_scripts(redis: Redis,
                                                                                   registry: Registry) -> None:
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    ids = [client.submit(client.request("src", session_id=f"s{i}")) for i in range(2)]
    ScriptsLostBeforeEachRecord.flushes = 0
    outcomes = ScriptsLostBeforeEachRecord(redis, ttl=600, stream_maxlen=1000)
    service = ForkService(registry, outcomes, reply_channel="sf:replies", limits=Limits(max_fanout=16))
    worker = ForkWorker([jobs.make_queue(redis, Settings())], service=service, connection=redis, abandoned_after=30)
    # A worker that cannot get past the lost scripts (a transaction's NOSCRIPT never loads them)
    # would retry for ever: past the deadline it gets the SIGTERM a supervisor would send.
    fired: list[bool] = []
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    watchdog = threading.Timer(STUCK_AFTER, lambda: (fired.append(True), os.kill(os.getpid(), signal.SIGTERM)))
    watchdog.start()
    try:
        worked = worker.work(burst=True, logging_level="WARNING", max_idle_time=5)
    finally:
        watchdog.cancel()
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert not fired, f"the worker was still retrying the lost scripts after {STUCK_AFTER:.0f} s"
    assert worked is True
    assert ScriptsLostBeforeEachRecord.flushes == 2  # each record met an empty script cache
    assert [service.outcomes.get(r).ok for r in ids] == [True, True]  # type: ignore[union-attr]
    assert [Job.fetch(r, connection=redis, serializer=jobs.JSONSerializer).get_status() for r in ids] == \
        ["finished", "finished"]
    assert [e.request for e in outcome_entries(redis)] == ids  # each announced once


def test_the_finish_runs_in_the_records_transaction_right_after_the_record(server: EmbeddedServer, redis: Redis,
                                                                          registry: Registry) -> None:
    """docs/guarantees.md, "Outcome stored before it is announced, announced once": the worker's RQ
    success bookkeeping goes in the same transaction as the record, so RQ never counts a job
    finished whose outcome is not stored. MONITOR shows what the server ran, in its order: one
    MULTI/EXEC holding the record's script first, then the job's "finished" status and its
    finished-registry entry; neither is written anywhere else."""
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    request_id = client.submit(client.request("src", session_id="c"))
    queue = jobs.make_queue(redis, Settings())
    service = ForkService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    worker = ForkWorker([queue], service=service, connection=redis, abandoned_after=30)
    with monitored(server) as seen:
        assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert service.outcomes.get(request_id).ok  # type: ignore[union-attr]
    job_key, finished_key = Job.key_for(request_id), queue.finished_job_registry.key

    def finishing(c: Command) -> bool:  # RQ's "finished": the job's status, the registry entry
        return (c.name == "HSET" and c.args[1] == job_key and "finished" in c.args[2:]) or \
            (c.name == "ZADD" and c.args[1] == finished_key and request_id in c.args[2:])

    (streamed,) = [i for i, c in enumerate(seen) if c.client == "lua" and c.writes({keys.OUTCOME_STREAM})]
    transaction = transaction_of(seen, streamed)  # the record's script appends to the outcome stream
    assert transaction is not None, "the record ran outside any transaction"
    assert transaction[0].name == "EVAL" and transaction[0].args[4] == keys.request(request_id), transaction[0]
    assert {c.name for c in transaction if finishing(c)} == {"HSET", "ZADD"}
    assert [c for c in seen if finishing(c)] == [c for c in transaction if finishing(c)]  # nowhere else


class AnotherAttemptRecordsFirst(Outcomes):
    """Another attempt of the request stores its outcome just before this one's record (two
    attempts racing): the record stores nothing and answers the first outcome."""

    def _record_then(self, reply: Any, named: dict[str, Any], then: Any) -> Any:
        first = ForkFailure(request_id=reply.request_id, code="INTERNAL", message="the other attempt's")
        Outcomes(self.redis, ttl=600, stream_maxlen=1000).record(first, "sf:replies")
        return super()._record_then(reply, named, then)


def test_rq_keeps_the_outcome_stored_first_as_the_jobs_result(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    request_id = client.submit(client.request("src", session_id="raced"))
    service = ForkService(registry, AnotherAttemptRecordsFirst(redis, ttl=600, stream_maxlen=1000),
                          reply_channel="sf:replies", limits=Limits(max_fanout=16))
    worker = ForkWorker([jobs.make_queue(redis, Settings())], service=service, connection=redis, abandoned_after=30)
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    stored = service.outcomes.get(request_id)
    assert isinstance(stored, ForkFailure) and stored.message == "the other attempt's"
    job = Job.fetch(request_id, connection=redis, serializer=jobs.JSONSerializer)
    assert job.get_status() == "finished"
    assert job.return_value() == msgspec.to_builtins(stored)  # not this attempt's reply
