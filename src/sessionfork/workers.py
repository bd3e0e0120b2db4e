"""``ForkWorker``: an RQ worker that runs fork requests in-process and refuses any other job.

What it does differently from ``rq worker``:

* no work-horse process per job (forks are O(1) and short): like RQ's ``SimpleWorker``, it keeps
  RQ's started/finished/failed registries, retries and abandoned-job recovery, and RQ's
  bookkeeping for a job takes two pipelines (start, finish) instead of a dozen round trips;
* it never imports the job's callable: a job must name ``sessionfork.jobs.fork`` with one string
  argument, else it is refused (``INVALID_REQUEST``, job failed, nothing run);
* every job that ends for good leaves its request one outcome: a job RQ fails (retries spent, an
  abandoned job, a job stuck in the intermediate queue) is finished by running its idempotent
  request once more, or refused;
* its loop is ``resilience.ResilientWorker``'s: stops never strand a job, bad queue entries and
  Redis outages never stop the worker.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from rq import Queue
from rq.exceptions import AbandonedJobError, DeserializationError
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.timeouts import JobTimeoutException
from rq.utils import now
from rq.worker import WorkerStatus

from . import jobs
from .errors import ErrorCode
from .resilience import ResilientWorker
from .service import ForkService
from .wire import ForkFailure, Reply

log = logging.getLogger("sessionfork.worker")


class _Refused(Exception):
    """A job that is not a sessionfork request; never run."""


class ForkWorker(ResilientWorker):
    """Runs ``sessionfork.jobs.fork`` jobs with ``service``; see the module docstring."""

    def __init__(self, queues: list[Queue], *, service: ForkService, abandoned_after: int,
                 on_outcome: Callable[[str, str, Reply, float], None] | None = None, **kwargs: Any) -> None:
        super().__init__(queues, serializer=jobs.JSONSerializer, job_class=jobs.ForkJob, **kwargs)
        self.service = service
        self.abandoned_after = abandoned_after
        self.on_outcome = on_outcome
        self._holding = False  # a job may be out of the queue and not finished yet
        self.push_exc_handler(self._finish_abandoned)  # type: ignore[no-untyped-call]  # rq leaves it untyped

    # RQ hooks ------------------------------------------------------------------------------------

    def get_heartbeat_ttl(self, job: Job) -> int:
        # The started-registry entry expires this long after the last heartbeat; a job whose
        # worker died is then abandoned and recovered by the next maintenance pass.
        return self.abandoned_after

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Run one job with RQ's bookkeeping in two pipelines (start, finish) around the fork.

        sessionfork jobs have no dependents, callbacks or repeats, so RQ's general success path
        (a WATCH loop and several round trips) is not needed; failures take RQ's own path.
        """
        try:
            try:
                payload = _payload(job)
            except _Refused as refused:
                self._until_up(lambda: self._start(job, queue))
                self._refuse(job, queue, queue.started_job_registry, str(refused))
                self._until_up(lambda: super(ForkWorker, self).set_state(WorkerStatus.IDLE))
                return
            self._run(job, queue, payload)
        finally:
            self._holding = False

    def _run(self, job: Job, queue: Queue, payload: str) -> None:
        self._until_up(lambda: self._start(job, queue))
        began = time.perf_counter()
        try:
            with self.death_penalty_class(job.timeout or self.queue_class.DEFAULT_TIMEOUT,
                                          JobTimeoutException, job_id=job.id):
                enqueued = None if job.enqueued_at is None else int(job.enqueued_at.timestamp() * 1000)
                reply = self._until_up(lambda: self.service.handle(
                    payload, job.id, final_attempt=jobs.is_final_attempt(job), enqueued_ms=enqueued))
        except Exception:
            job.ended_at = now()
            job._status = JobStatus.FAILED
            exc_info = sys.exc_info()
            self.handle_exception(job, *exc_info)
            self._until_up(lambda: self.handle_job_failure(
                job=job, queue=queue, started_job_registry=queue.started_job_registry,
                exc_string="".join(traceback.format_exception(*exc_info))))
            self._until_up(lambda: super(ForkWorker, self).set_state(WorkerStatus.IDLE))
            if jobs.is_final_attempt(job):  # the request ended: its INTERNAL outcome counts too
                final = self._until_up(lambda: self.service.outcomes.get(job.id))
                if final is not None:
                    self._observe(job.id, payload, final, time.perf_counter() - began)
            return
        job.ended_at = now()
        job._result = reply
        self._until_up(lambda: self._finish(job))
        self._observe(job.id, payload, reply, time.perf_counter() - began)

    def _start(self, job: Job, queue: Queue) -> None:
        # RQ's prepare_execution and prepare_job_execution in one pipeline; it never reads the
        # job's payload, so a refused job goes through it too.
        ttl = self.get_heartbeat_ttl(job)
        with self.connection.pipeline() as pipe:
            self.execution = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
            super().set_state(WorkerStatus.BUSY, pipeline=pipe)
            self.set_current_job_id(job.id, pipeline=pipe)
            super().heartbeat(ttl, pipeline=pipe)
            job.prepare_for_execution(self.name, pipeline=pipe)
            if len(self.queues) == 1:
                pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            pipe.execute()

    def _finish(self, job: Job) -> None:
        assert self.execution is not None and job.started_at is not None and job.ended_at is not None
        result_ttl = job.get_result_ttl(self.default_result_ttl)
        with self.connection.pipeline() as pipe:
            self.increment_successful_job_count(pipeline=pipe)
            self.increment_total_working_time(job.ended_at - job.started_at, pipe)
            job._handle_success(result_ttl, pipeline=pipe, worker_name=self.name,
                                execution_id=self.execution.id, execution_started_at=self.execution.created_at,
                                execution_ended_at=job.ended_at)
            job.cleanup(result_ttl, pipeline=pipe, remove_from_queue=False)
            self.cleanup_execution(job, pipeline=pipe)
            super().set_state(WorkerStatus.IDLE, pipeline=pipe)
            pipe.execute()

    # sessionfork's own --------------------------------------------------------------------------

    def _refuse(self, job: Job, queue: Queue, started: StartedJobRegistry, reason: str) -> None:
        log.warning("refused job %s: %s", job.id, reason)
        failure = ForkFailure(request_id=job.id, code=ErrorCode.INVALID_REQUEST.value, message=reason)
        reply = self._until_up(lambda: self.service.outcomes.record(
            failure, self.service.reply_channel, digest="invalid:job"))
        job.retries_left = None  # a refused job is never retried
        job.ended_at = now()
        self._until_up(lambda: self.handle_job_failure(job=job, queue=queue, started_job_registry=started,
                                                       exc_string=f"refused: {reason}"))
        self._observe(job.id, "", reply, 0.0)

    def _observe(self, request_id: str, payload: str, reply: Reply, seconds: float) -> None:
        if self.on_outcome is None:
            return
        try:
            self.on_outcome(request_id, payload, reply, seconds)
        except Exception:  # metrics and logs must never stop the worker
            log.exception("outcome observer failed for %s", request_id)

    def handle_job_failure(self, job: Job, queue: Queue, started_job_registry: Any = None,
                           exc_string: str = "") -> None:
        # RQ ends jobs here from several places (a failed run, the intermediate-queue cleanup);
        # a job that ends without a retry must still leave its request one outcome.
        retried = job.should_retry and self._stopped_job_id != job.id
        super().handle_job_failure(job, queue, started_job_registry, exc_string)
        if not retried:
            self._ensure_outcome(job)

    def _finish_abandoned(self, job: Job, exc_type: type[BaseException], *_: Any) -> bool:
        # Called by RQ for every job failure; acts on jobs abandoned by a dead worker whose
        # retries are spent (RQ's started-registry cleanup fails them without handle_job_failure).
        if issubclass(exc_type, AbandonedJobError) and jobs.is_final_attempt(job):
            self._ensure_outcome(job)
        return True

    def _ensure_outcome(self, job: Job) -> None:
        """Give a request whose job ended for good its one outcome, if it has none yet.

        The request is idempotent, so running it here finishes it (or records ``INTERNAL``).
        """
        try:
            if self.service.outcomes.get(job.id) is not None:
                return
            try:
                payload = _payload(job)
            except _Refused as refused:
                failure = ForkFailure(request_id=job.id, code=ErrorCode.INVALID_REQUEST.value, message=str(refused))
                reply = self.service.outcomes.record(failure, self.service.reply_channel, digest="invalid:job")
                self._observe(job.id, "", reply, 0.0)
                return
            try:
                reply = self.service.handle(payload, job.id, final_attempt=True)
            finally:
                stored = self.service.outcomes.get(job.id)
                if stored is not None:
                    self._observe(job.id, payload, stored, 0.0)
        except Exception:
            log.exception("could not finish the request of job %s", job.id)

    def _refuse_entry(self, job_id: str, exc: Exception) -> None:
        reason = f"queue entry {job_id!r} is not a loadable sessionfork job ({type(exc).__name__}: {exc})"
        log.warning("refused %s", reason)
        failure = ForkFailure(request_id=job_id, code=ErrorCode.INVALID_REQUEST.value, message=reason)
        # The outcome first: a worker dying in between leaves the entry, to be refused again.
        self.service.outcomes.record(failure, self.service.reply_channel, digest="invalid:job")
        for queue in self.queues:
            self.connection.lrem(queue.intermediate_queue_key, 1, job_id)
        self._observe(job_id, "", failure, 0.0)


def _payload(job: Job) -> str:
    """The request payload of a sessionfork job; ``_Refused`` for anything else."""
    try:
        name, args, kwargs = job.func_name, job.args, job.kwargs
    except (DeserializationError, ValueError, TypeError) as exc:
        raise _Refused(f"job payload is not a JSON sessionfork job ({type(exc).__name__})") from None
    if name != jobs.JOB_FUNCTION:
        raise _Refused(f"job names {name!r}; this worker runs only {jobs.JOB_FUNCTION}")
    if kwargs or len(args) != 1 or not isinstance(args[0], str):
        raise _Refused(f"{jobs.JOB_FUNCTION} takes exactly one argument: the request JSON as a string")
    return args[0]


def fresh_workers(redis: Any, settings: Any) -> list[str]:
    """Names of the workers of ``settings.queue`` whose heartbeat is younger than their TTL."""
    queue = jobs.make_queue(redis, settings)
    cutoff = now().timestamp() - settings.worker_ttl
    return [w.name for w in ResilientWorker.all(queue=queue)
            if w.last_heartbeat is not None and w.last_heartbeat.timestamp() >= cutoff]
