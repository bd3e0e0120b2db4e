"""``ForkWorker``: an RQ worker that runs fork requests in-process and refuses any other job.

What it does differently from ``rq worker``:

* no work-horse process per job (forks are O(1) and short): like RQ's ``SimpleWorker``, it keeps
  RQ's started/finished/failed registries, retries and abandoned-job recovery;
* it never imports the job's callable: a job must name ``sessionfork.jobs.fork`` with one string
  argument, else it is refused (``INVALID_REQUEST``, job failed, nothing run);
* a dropped Redis connection does not fail the job in hand: the request is idempotent, so the
  worker waits for Redis to come back and runs it again;
* an abandoned job (its worker died) whose retries are spent is finished by the maintenance pass
  that finds it, so its request still gets its one outcome.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, SimpleWorker
from rq.exceptions import AbandonedJobError, DeserializationError
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.timeouts import JobTimeoutException
from rq.utils import now
from rq.worker import WorkerStatus

from . import jobs
from .errors import ErrorCode
from .service import ForkService
from .wire import ForkFailure, Reply

T = TypeVar("T")
log = logging.getLogger("sessionfork.worker")
_DOWN = (RedisConnectionError, RedisTimeoutError)
_HEARTBEAT_EVERY = 1.0


class _Refused(Exception):
    """A job that is not a sessionfork request; never run."""


class ForkWorker(SimpleWorker):
    """Runs ``sessionfork.jobs.fork`` jobs with ``service``; see the module docstring."""

    def __init__(self, queues: list[Queue], *, service: ForkService, abandoned_after: int,
                 on_outcome: Callable[[str, str, Reply, float], None] | None = None, **kwargs: Any) -> None:
        super().__init__(queues, serializer=jobs.JSONSerializer, **kwargs)
        self.service = service
        self.abandoned_after = abandoned_after
        self.on_outcome = on_outcome
        self.push_exc_handler(self._finish_abandoned)  # type: ignore[no-untyped-call]  # rq leaves it untyped

    # RQ hooks ------------------------------------------------------------------------------------

    def get_heartbeat_ttl(self, job: Job) -> int:
        # The started-registry entry expires this long after the last heartbeat; a job whose
        # worker died is then abandoned and recovered by the next maintenance pass.
        return self.abandoned_after

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            return
        # RQ heart-beats several times per job; once a second is plenty against a TTL of minutes.
        last = self.last_heartbeat
        if last is not None and timeout is None and (now() - last).total_seconds() < _HEARTBEAT_EVERY:
            return
        self._until_up(lambda: super(ForkWorker, self).heartbeat(timeout))

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is None and state == self._state:
            return  # already recorded (the job's last pipeline sets IDLE)
        super().set_state(state, pipeline)

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Run one job with RQ's bookkeeping in two pipelines (start, finish) around the fork.

        sessionfork jobs have no dependents, callbacks or repeats, so RQ's general success path
        (a WATCH loop and several round trips) is not needed; failures take RQ's own path.
        """
        try:
            payload = _payload(job)
        except _Refused as refused:
            self._until_up(lambda: self.prepare_execution(job))
            self._until_up(lambda: self.prepare_job_execution(job, len(self.queues) == 1))
            self._refuse(job, queue, queue.started_job_registry, str(refused))
            self._until_up(lambda: super(ForkWorker, self).set_state(WorkerStatus.IDLE))
            return
        self._until_up(lambda: self._start(job, queue))
        began = time.perf_counter()
        try:
            with self.death_penalty_class(job.timeout or self.queue_class.DEFAULT_TIMEOUT,
                                          JobTimeoutException, job_id=job.id):
                reply = self._until_up(lambda: self.service.handle(
                    payload, job.id, final_attempt=jobs.is_final_attempt(job)))
        except Exception:
            job.ended_at = now()
            job._status = JobStatus.FAILED
            exc_info = sys.exc_info()
            self.handle_exception(job, *exc_info)
            self._until_up(lambda: self.handle_job_failure(
                job=job, queue=queue, started_job_registry=queue.started_job_registry,
                exc_string="".join(traceback.format_exception(*exc_info))))
            self._until_up(lambda: super(ForkWorker, self).set_state(WorkerStatus.IDLE))
            return
        job.ended_at = now()
        job._result = reply
        self._until_up(lambda: self._finish(job))
        if self.on_outcome is not None:
            self.on_outcome(job.id, payload, reply, time.perf_counter() - began)

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        # RQ's version, minus the process title that would deserialize a refused job's payload.
        with self.connection.pipeline() as pipe:
            self.set_current_job_id(job.id, pipeline=pipe)
            ttl = self.get_heartbeat_ttl(job)
            super().heartbeat(ttl, pipeline=pipe)
            job.prepare_for_execution(self.name, pipeline=pipe)
            if remove_from_intermediate_queue:
                pipe.lrem(Queue(job.origin, connection=self.connection).intermediate_queue_key, 1, job.id)
            pipe.execute()

    def _start(self, job: Job, queue: Queue) -> None:
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
        if self.on_outcome is not None:
            self.on_outcome(job.id, "", reply, 0.0)

    def _finish_abandoned(self, job: Job, exc_type: type[BaseException], *_: Any) -> bool:
        # Called by RQ for every job failure; acts only on jobs abandoned by a dead worker whose
        # retries are spent. The request is idempotent, so finishing it here is safe.
        if not issubclass(exc_type, AbandonedJobError) or not jobs.is_final_attempt(job):
            return True
        try:
            payload = _payload(job)
        except _Refused as refused:
            payload = None
            reason = str(refused)
        try:
            if payload is None:
                failure = ForkFailure(request_id=job.id, code=ErrorCode.INVALID_REQUEST.value, message=reason)
                self.service.outcomes.record(failure, self.service.reply_channel, digest="invalid:job")
            else:
                self.service.handle(payload, job.id, final_attempt=True)
        except Exception:
            log.exception("could not finish abandoned job %s", job.id)
        return True

    def _until_up(self, step: Callable[[], T]) -> T:
        """Run ``step``; while Redis is unreachable, back off and run it again (steps are idempotent)."""
        delay = 0.1
        while True:
            try:
                return step()
            except _DOWN as exc:
                if self._stop_requested:
                    raise
                log.warning("Redis unreachable (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)  # back-off, not synchronisation
                delay = min(delay * 2, 5.0)


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
    return [w.name for w in SimpleWorker.all(queue=queue)
            if w.last_heartbeat is not None and w.last_heartbeat.timestamp() >= cutoff]
