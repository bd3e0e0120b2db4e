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
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.service import RequestService

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)


class PrimaryDiesInFinish(RequestWorker):
    """The first success pipeline fails after the job's finish (the execution's clean-up in it)
    was queued in it."""

    failed_finishes = 0

    def finish(self, jobs: Any, queue: Any, results: Any, executions: Any, pipe: Any, last: bool = True) -> float:
        worked = super().finish(jobs, queue, results, executions, pipe, last)
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


@pytest.mark.parametrize("batch", [1, 32], ids=["one-at-a-time", "batches"])
@pytest.mark.parametrize("kept", [False, True], ids=["ledger", "kept-for-ever"])
def test_a_finish_that_failed_mid_pipeline_is_run_again_and_the_worker_goes_on(redis: Redis, registry: Registry,
                                                                              kept: bool, batch: int) -> None:
    """Both finishes: the ledger's (a fork job's) and RQ's own methods' (a job whose result is kept
    for ever: RQ's ``cleanup_execution`` drops the worker's execution before the pipeline runs)."""
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    ids = [client.submit(client.request("src", session_id=f"c{i}-{kept}")) for i in range(2)]
    if kept:
        for request_id in ids:
            redis.hset(f"rq:job:{request_id}", "result_ttl", -1)
    service = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    worker = PrimaryDiesInFinish([jobs.make_queue(redis, Settings())], service=service, connection=redis,
                                 abandoned_after=30, batch=batch)
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert worker.failed_finishes == 1  # the failure happened
    assert [Job.fetch(r, connection=redis, serializer=jobs.JSONSerializer).get_status() for r in ids] == \
        ["finished", "finished"]
    assert [service.outcomes.get(r).ok for r in ids] == [True, True]  # type: ignore[union-attr]
    assert jobs.make_queue(redis, Settings()).started_job_registry.count == 0  # nothing left started


STUCK_AFTER = 20.0
"""Seconds after which a worker still retrying a server's lost scripts is deemed stuck (the two jobs
take about a second)."""

class ScriptsLostBeforeEachRecord(RequestWorker):
    """The queue server loses its scripts (a restart, SCRIPT FLUSH) right before each record of
    outcomes is sent: the record's transaction, which carries RQ's success bookkeeping (added to
    it here, as it is built), meets an empty cache."""

    flushes = 0

    def finish(self, jobs: Any, queue: Any, results: Any, executions: Any, pipe: Any, last: bool = True) -> float:
        self.connection.script_flush()
        self.flushes += 1
        return super().finish(jobs, queue, results, executions, pipe, last)


@pytest.mark.parametrize("batch", [1, 32], ids=["one-at-a-time", "batches"])
def test_the_finish_never_runs_without_the_outcome_when_the_server_lost_its_scripts(redis: Redis,
                                                                                   registry: Registry,
                                                                                   batch: int) -> None:
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    ids = [client.submit(client.request("src", session_id=f"s{i}")) for i in range(2)]
    service = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    worker = ScriptsLostBeforeEachRecord([jobs.make_queue(redis, Settings())], service=service, connection=redis,
                                         abandoned_after=30, batch=batch)
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
    assert worker.flushes == (2 if batch == 1 else 1)  # each record (a batch's: one) met an empty script cache
    assert [service.outcomes.get(r).ok for r in ids] == [True, True]  # type: ignore[union-attr]
    assert [Job.fetch(r, connection=redis, serializer=jobs.JSONSerializer).get_status() for r in ids] == \
        ["finished", "finished"]
    assert [e.request for e in outcome_entries(redis)] == ids  # each announced once


@pytest.mark.parametrize("batch", [1, 32], ids=["one-at-a-time", "batches"])
def test_the_finish_runs_in_the_records_transaction_right_after_the_record(server: EmbeddedServer, redis: Redis,
                                                                          registry: Registry, batch: int) -> None:
    """docs/guarantees.md, "Outcome stored before it is announced, announced once": the worker's RQ
    success bookkeeping goes in the same transaction as the record, so RQ never counts a job
    finished whose outcome is not stored. MONITOR shows what the server ran, in its order: one
    MULTI/EXEC holding the record's script first, then the job's "finished" status and its
    finished-registry entry; neither is written anywhere else."""
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    request_id = client.submit(client.request("src", session_id="c"))
    other = client.submit(client.request("src", session_id="d"))  # with batches: one batch of two
    queue = jobs.make_queue(redis, Settings())
    service = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    worker = RequestWorker([queue], service=service, connection=redis, abandoned_after=30, batch=batch)
    with monitored(server) as seen:
        assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert service.outcomes.get(request_id).ok and service.outcomes.get(other).ok  # type: ignore[union-attr]
    finished_key = queue.finished_job_registry.key

    def finishing(c: Command, job_id: str) -> bool:  # RQ's "finished": the job's status, the registry entry
        return (c.name == "HSET" and c.args[1] == Job.key_for(job_id) and "finished" in c.args[2:]) or \
            (c.name == "ZADD" and c.args[1] == finished_key and job_id in c.args[2:])

    # The record's script appends each outcome to the outcome stream, in queue order.
    streamed = [i for i, c in enumerate(seen) if c.client == "lua" and c.writes({keys.OUTCOME_STREAM})]
    assert len(streamed) == 2, streamed
    transactions = [transaction_of(seen, i) for i in streamed]
    for job_id, transaction in zip((request_id, other), transactions, strict=True):
        assert transaction is not None, "the record ran outside any transaction"
        assert transaction[0].name == "EVAL" and keys.request(job_id) in transaction[0].args, transaction[0]
        assert {c.name for c in transaction if finishing(c, job_id)} == {"HSET", "ZADD"}
        assert [c for c in seen if finishing(c, job_id)] == [c for c in transaction if finishing(c, job_id)]
    if batch > 1:  # the batch's records and RQ's finish of both jobs: one transaction
        assert transactions[0] == transactions[1]


class AnotherAttemptRecordsFirst(RequestWorker):
    """Another attempt of the request stores its outcome just before this one's record is sent (two
    attempts racing): the record stores nothing and answers the first outcome."""

    def finish(self, jobs: Any, queue: Any, results: Any, executions: Any, pipe: Any, last: bool = True) -> float:
        first = ForkFailure(request_id=jobs[0].id, code="INTERNAL", message="the other attempt's")
        Outcomes(self.connection, ttl=600, stream_maxlen=1000).record(first, "sf:replies")
        return super().finish(jobs, queue, results, executions, pipe, last)


@pytest.mark.parametrize("batch", [1, 32], ids=["one-at-a-time", "batches"])
def test_rq_keeps_the_outcome_stored_first_as_the_jobs_result(redis: Redis, registry: Registry, batch: int) -> None:
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    request_id = client.submit(client.request("src", session_id="raced"))
    service = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000),
                          reply_channel="sf:replies", limits=Limits(max_fanout=16))
    worker = AnotherAttemptRecordsFirst([jobs.make_queue(redis, Settings())], service=service, connection=redis,
                                        abandoned_after=30, batch=batch)
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    stored = service.outcomes.get(request_id)
    assert isinstance(stored, ForkFailure) and stored.message == "the other attempt's"
    job = Job.fetch(request_id, connection=redis, serializer=jobs.JSONSerializer)
    assert job.get_status() == "finished"
    assert job.return_value() == msgspec.to_builtins(stored)  # not this attempt's reply


class StartReplyLost(RequestWorker):
    """The first pipeline that carries a start runs on the server, and its reply is lost (the
    connection dropped as the server answered): the worker sends the whole trip again."""

    lost_replies = 0

    def start(self, jobs: Any, queue: Any, pipe: Any, again: Any = ()) -> Any:
        executions = super().start(jobs, queue, pipe, again)
        if self.lost_replies:
            return executions
        real = pipe.execute

        def reply_lost(*args: Any, **kwargs: Any) -> Any:
            real(*args, **kwargs)
            self.lost_replies += 1
            raise RedisConnectionError("the connection dropped as the server answered")

        pipe.execute = reply_lost
        return executions


@pytest.mark.parametrize("batch", [1, 32], ids=["one-at-a-time", "batches"])
def test_a_start_sent_again_after_its_reply_was_lost_leaves_one_execution(redis: Redis, registry: Registry,
                                                                         batch: int) -> None:
    """A trip run again after an outage sends RQ's start again: the same execution is written
    again, so the job's finish cleans up all it started (a second execution would be left in RQ's
    started registry, and one worker cannot clear two at the finish)."""
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    ids = [client.submit(client.request("src", session_id=f"again-{batch}-{i}")) for i in range(2)]
    service = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    queue = jobs.make_queue(redis, Settings())
    worker = StartReplyLost([queue], service=service, connection=redis, abandoned_after=30, batch=batch)
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert worker.lost_replies == 1  # the reply was lost after the start ran
    assert [Job.fetch(r, connection=redis, serializer=jobs.JSONSerializer).get_status() for r in ids] == \
        ["finished", "finished"]
    assert [service.outcomes.get(r).ok for r in ids] == [True, True]  # type: ignore[union-attr]
    assert [e.request for e in outcome_entries(redis)] == ids
    assert queue.started_job_registry.get_job_ids(cleanup=False) == []  # nothing left started
    if hasattr(worker, "executions_key"):  # RQ 3's index of the worker's executions
        assert redis.smembers(worker.executions_key) == set()


def test_jobs_whose_outcomes_go_on_another_client_are_started_and_finished_on_their_own(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    """The outcomes on another client than the worker's connection: RQ's bookkeeping cannot ride the
    batch's round trips, and is sent on its own. Every job ends finished, a replay's too (its
    request answered before the worker took it), and nothing is left started."""
    registry.append(registry.create("src"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    client = Client(redis)
    request = client.request("src", session_id="apart-replayed", request_id="apart-replayed")
    ids = [client.submit(client.request("src", session_id="apart-new", request_id="apart-new")),
           client.submit(request)]
    with server.client() as other:
        service = RequestService(registry, Outcomes(other, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                              limits=Limits(max_fanout=16))
        first = service.handle(msgspec.json.encode(request), "apart-replayed")  # answered before the worker runs it
        worker = RequestWorker([jobs.make_queue(redis, Settings())], service=service, connection=redis,
                            abandoned_after=30)
        assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert [Job.fetch(r, connection=redis, serializer=jobs.JSONSerializer).get_status() for r in ids] == \
        ["finished", "finished"]
    assert Job.fetch(ids[1], connection=redis, serializer=jobs.JSONSerializer).return_value() == \
        msgspec.to_builtins(first)
    assert jobs.make_queue(redis, Settings()).started_job_registry.count == 0
    assert sorted(e.request for e in outcome_entries(redis)) == sorted(ids)  # each announced once
