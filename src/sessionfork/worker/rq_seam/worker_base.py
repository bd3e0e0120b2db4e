"""The worker class of the RQ seam (``SeamWorker``): a job's RQ bookkeeping (start, finish, failure),
the heartbeat and registration, on top of the dequeue (``dequeue``) and maintenance
(``maintenance``) halves. Every RQ name used here is listed, with its reason, in the package
docstring (``sessionfork.worker.rq_seam``); the job classes are in ``entries``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from redis.exceptions import RedisError
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.results import Result
from rq.suspension import WORKERS_SUSPENDED
from rq.timeouts import JobTimeoutException
from rq.utils import now
from rq.version import VERSION
from rq.worker import WorkerStatus

from .dequeue import DequeuingWorker

T = TypeVar("T")
log = logging.getLogger("sessionfork.worker")
RQ_MAJOR = int(VERSION.split(".")[0])
_HEARTBEAT_EVERY = 1.0


class SeamWorker(DequeuingWorker):
    """RQ's in-process worker loop, hardened for short idempotent jobs; see the module docstring.

    Subclasses implement ``run_job`` with ``start``, ``run_in_time``, ``finish`` and ``fail``,
    ``refuse_entry`` for queue entries RQ cannot load, and ``job_ended`` for jobs RQ failed for good.
    """

    job_ttl: int | None = None  # caps how long a finished job is kept, whatever its hash asks
    _beat_at: float = float("-inf")  # time.monotonic() of this worker's last own heartbeat
    _unsuspended: bool = False  # the last job's finish found no `rq suspend` in force
    _finishing: Execution | None = None  # the execution a finish in flight cleans up
    _worked: float = 0.0  # the working time (s) of the job whose finish is in flight
    # RQ's worker counters not sent yet (successful jobs, working time): batched into the beat.
    _unsent_jobs: int = 0
    _unsent_time: float = 0.0
    _flushing: tuple[int, float] = (0, 0.0)  # the counters a pipeline in flight adds

    def run_job(self, job: Job, queue: Queue) -> None:
        raise NotImplementedError

    def execute_job(self, job: Job, queue: Queue) -> None:
        """RQ's documented hook: run one dequeued job (``run_job``), in this process."""
        try:
            self.run_job(job, queue)
        finally:
            self._holding = False  # the job is done: a stop request may now stop the worker

    def run_in_time(self, job: Job, step: Callable[[], T]) -> T:
        """Run ``step`` under the job's timeout (RQ's ``JobTimeoutException`` when it runs over)."""
        with self.death_penalty_class(job.timeout or self.queue_class.DEFAULT_TIMEOUT,
                                      JobTimeoutException, job_id=job.id):
            return step()

    # -- job bookkeeping -------------------------------------------------------------------------

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # The started-registry entry expires this long after the last heartbeat; a job whose
        # worker died is then abandoned and recovered by the next maintenance pass.
        return self.abandoned_after

    def start(self, job: Job, queue: Queue, pipe: Any = None) -> None:
        """RQ's prepare_execution and prepare_job_execution in one pipeline: sent now, or added to
        ``pipe`` (``JobStart``: ahead of the request's claim, in its round trip)."""
        if pipe is None:
            with self.connection.pipeline() as own:
                self.start(job, queue, own)
                own.execute()
            return
        ttl = self.get_heartbeat_ttl(job)
        self.execution = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
        super().set_state(WorkerStatus.BUSY, pipeline=pipe)
        if RQ_MAJOR < 3:
            getattr(self, "set_current_job_id")(job.id, pipeline=pipe)  # noqa: B009 - gone in RQ 3
        super().heartbeat(ttl, pipeline=pipe)
        job.prepare_for_execution(self.name, pipeline=pipe)
        if len(self.queues) == 1:
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        self._holding = True

    def finish(self, job: Job, result: Any, pipe: Any = None) -> None:
        """RQ's success path (result, finished registry, counters, cleanup) in one pipeline, which
        also reads whether ``rq suspend`` is in force (the loop's next suspension check): sent
        now, or added to ``pipe`` (``JobFinish``: after the outcome's record, in its transaction);
        its sender then calls ``finished`` with the replies, or ``finish_failed``."""
        if pipe is None:
            with self.connection.pipeline() as own:
                self.finish(job, result, own)
                try:
                    replies = own.execute()
                except BaseException:
                    self.finish_failed()
                    raise
            self.finished(replies)
            return
        execution = self._finishing = self.execution
        assert execution is not None and job.started_at is not None
        job.ended_at = now()
        job._result = result
        result_ttl = self._result_ttl(job)
        # RQ's counters (successful_job_count, total_working_time) go with the next beat, once a
        # second (``flush_counters``), not with every job.
        self._worked = (job.ended_at - job.started_at).total_seconds()
        job._handle_success(result_ttl, pipeline=pipe, worker_name=self.name, execution_id=execution.id,
                            execution_started_at=execution.created_at, execution_ended_at=job.ended_at)
        if result_ttl is not None and result_ttl > 0:
            # RQ's cleanup, less its EXPIREs of the dependents and dependencies keys: a fork job
            # has neither (nothing enqueues one with depends_on, and the finish enqueues no dependents).
            pipe.expire(job.key, result_ttl)
        else:
            job.cleanup(result_ttl, pipeline=pipe, remove_from_queue=False)
        self._cleanup_execution(job, pipe, execution)
        super().set_state(WorkerStatus.IDLE, pipeline=pipe)
        pipe.lindex(self.queues[0].key, 0)  # the next job's id, likely: its hash comes with the next dequeue
        pipe.exists(WORKERS_SUSPENDED)

    def finish_failed(self) -> None:
        """The finish's pipeline failed (it may run again)."""
        self.execution = self._finishing  # not cleaned up after all: a retried finish needs it

    def finished(self, replies: list[Any]) -> None:
        """The finish's pipeline ran; ``replies`` are its commands' (the last two: the queue's front
        entry, the suspension key)."""
        if RQ_MAJOR >= 3:
            self.execution = None
        self._front = replies[-2] if len(self.queues) == 1 else None
        self._unsuspended = not replies[-1]
        self._unsent_jobs += 1
        self._unsent_time += self._worked

    def flush_counters(self, pipe: Any) -> None:
        """Add RQ's worker counters not sent yet to ``pipe``: its ``successful_job_count`` (RQ's
        ``increment_successful_job_count`` adds 1 per job) and ``increment_total_working_time``,
        once for the jobs since the last flush; ``counters_sent`` once ``pipe`` ran."""
        if self._unsent_jobs:
            pipe.hincrby(self.key, "successful_job_count", self._unsent_jobs)
            self.increment_total_working_time(timedelta(seconds=self._unsent_time), pipe)
        self._flushing = self._unsent_jobs, self._unsent_time

    def counters_sent(self) -> None:
        jobs, seconds = self._flushing
        self._unsent_jobs -= jobs
        self._unsent_time -= seconds

    def correct_result(self, job: Job, result: Any) -> None:
        """RQ's result of a finished job made ``result``: the outcome another attempt stored first
        (the finish went out with this attempt's reply, in the record's transaction)."""
        Result.create(job, Result.Type.SUCCESSFUL, self._result_ttl(job), return_value=result, worker_name=self.name)

    def _result_ttl(self, job: Job) -> Any:
        result_ttl = job.get_result_ttl(self.default_result_ttl)
        if self.job_ttl is not None and (result_ttl is None or result_ttl < 0 or result_ttl > self.job_ttl):
            result_ttl = self.job_ttl  # the outcome lives on in sf:req:<id>; RQ's copy need not
        return result_ttl

    def fail(self, job: Job, queue: Queue, exc_string: str, *, exc_info: Any = None, retry: bool = True) -> None:
        """RQ's failure path: exception handlers (with ``exc_info``), then retried when the job has
        retries left (and ``retry``), else failed."""
        if exc_info is not None:
            self.handle_exception(job, *exc_info)
        if not retry:
            job.retries_left = None
        job.ended_at = now()
        job._status = JobStatus.FAILED
        self.handle_job_failure(job=job, queue=queue, started_job_registry=queue.started_job_registry,
                                exc_string=exc_string)
        super().set_state(WorkerStatus.IDLE)

    def job_ended(self, job: Job) -> None:
        """Called once RQ has failed ``job`` for good (no retry follows)."""

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry: Any = None,
                           exc_string: str = "", execution: Any = None) -> None:
        # RQ calls this from several places (a failed run, the intermediate-queue cleanup).
        retried = job.should_retry and self._stopped_job_id != job.id
        # RQ 3 takes the execution to clean up (without it, nothing is cleaned); RQ 2 has no such argument.
        extra: dict[str, Any] = {"execution": execution or self.execution} if RQ_MAJOR >= 3 else {}
        super().handle_job_failure(job, queue, started_job_registry, exc_string, **extra)
        if RQ_MAJOR >= 3:
            self.execution = None
        if not retried:
            self.job_ended(job)

    def _cleanup_execution(self, job: Job, pipe: Any, execution: Execution) -> None:
        extra: dict[str, Any] = {"execution": execution} if RQ_MAJOR >= 3 else {}
        self.cleanup_execution(job, pipeline=pipe, **extra)

    # -- the loop ----------------------------------------------------------------------------------

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        # RQ registers the worker before it installs its signal handlers: a SIGTERM in between
        # would kill it uncleanly. Install them first; a stop during start-up is a clean stop.
        self._install_signal_handlers()  # type: ignore[no-untyped-call]
        try:
            super().bootstrap(*args, **kwargs)
        except StopRequested:
            self._stop_requested = True

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            return
        # RQ heart-beats several times per job; once a second is plenty against a TTL of minutes.
        # Throttled on this worker's own beats, not on the job pipelines' (which refresh
        # ``last_heartbeat`` with every job): a busy worker still checks its registration.
        if timeout is None and time.monotonic() - self._beat_at < _HEARTBEAT_EVERY:
            return
        self.until_up(self._beat)

    def _beat(self) -> None:
        """One round trip: the heartbeat, RQ's worker counters of the jobs since the last beat
        (``flush_counters``), and whether the worker is still registered.

        A server that restarted empty lost the worker's registration: it registers again, so that
        ``health`` and ``rq info`` see a worker that is serving. The registration's ``birth`` field
        is the test, not the worker hash: a job's bookkeeping writes the hash, and would recreate
        it (registration writes the hash with ``birth`` and RQ's worker sets in one transaction).
        """
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.hexists(self.key, "birth")
            super().heartbeat(None, pipe)
            self.flush_counters(pipe)
            registered = pipe.execute()[0]
        self.counters_sent()
        if not registered:
            log.warning("worker %s was no longer registered (a server that lost its data?); registering again",
                        self.name)
            self.connection.delete(self.key)  # a hash rewritten by a job's bookkeeping is not a registration
            self.register_birth()  # type: ignore[no-untyped-call]
            super().set_state(self._state)  # RQ's registration does not record the state
        self._beat_at = time.monotonic()

    def teardown(self) -> None:
        # The counters of the jobs since the last beat, before RQ unregisters the worker (best
        # effort, like the unregistering: a worker killed instead loses at most a second's worth;
        # not tried when the loop stopped with Redis unreachable).
        if self.unreachable_at_stop:
            super().teardown()
            return
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                self.flush_counters(pipe)
                pipe.execute()
            self.counters_sent()
        except RedisError as exc:
            log.warning("could not send the counters of worker %s: %s", self.name, exc)
        super().teardown()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is None and state == self._state:
            return  # already recorded (the job's last pipeline sets IDLE)
        super().set_state(state, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        # Right after a job, the job's last pipeline has just read the suspension key: RQ's own
        # check (a round trip, with a heartbeat the job's pipelines sent too) would read it again.
        if self._unsuspended:
            self._unsuspended = False
            return
        # RQ's loop calls this outside any guard: a Redis time-out there would end the worker.
        self.until_up(lambda: super(SeamWorker, self).check_for_suspension(burst))
