"""The worker and job classes of the RQ seam: every RQ name used here is listed, with its reason, in
the package docstring (``sessionfork.queue.rq_seam``)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import RedisError
from rq import SimpleWorker, worker_registration
from rq.exceptions import DequeueTimeout, NoSuchJobError, StopRequested
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import clean_registries
from rq.results import Result
from rq.suspension import WORKERS_SUSPENDED
from rq.timeouts import JobTimeoutException
from rq.utils import now
from rq.version import VERSION
from rq.worker import WorkerStatus

from ..outages import is_outage

T = TypeVar("T")
log = logging.getLogger("sessionfork.worker")
RQ_MAJOR = int(VERSION.split(".")[0])
_HEARTBEAT_EVERY = 1.0
_IDLE_POLL = 1  # seconds an idle worker blocks waiting for a job before it looks at its stop flag


class MalformedJob(ValueError):
    """A job hash that exists but cannot be loaded (no ``data``)."""


class ForkJob(Job):
    """RQ's Job as a fork worker must load it: nothing in the hash may make the worker act.

    * A job hash without ``data`` is ``MalformedJob`` (RQ skips it like an expired job, so its
      request would never get an outcome); the worker refuses it.
    * Webhooks and success/failure/stopped callbacks are dropped: anyone who may enqueue may write
      a job hash, and RQ would POST to those URLs or import and call those names.
    """

    def restore(self, raw_data: Any) -> Any:
        try:
            restored = super().restore(raw_data)
        except NoSuchJobError as exc:
            raise MalformedJob(str(exc)) from None
        self.webhooks = []
        self._success_callback_name = self._failure_callback_name = self._stopped_callback_name = None
        return restored


class _DequeuedJob(ForkJob):
    """``ForkJob`` as the dequeue loads a queue entry: the entry itself must be a job id by RQ's
    rule and name a job hash, else it is refused (with an outcome), never skipped."""

    @classmethod
    def fetch(cls, id: str, connection: Any = None, serializer: Any = None) -> Any:
        _refuse_colon(id)
        try:
            return super().fetch(id, connection=connection, serializer=serializer)
        except NoSuchJobError:
            # RQ drops such an entry silently, leaving it in its intermediate queue and its id
            # with no outcome.
            raise MalformedJob("the queue entry names no job hash") from None

    @classmethod
    def loaded(cls, id: str, data: dict[bytes, bytes], connection: Any, serializer: Any) -> Any:
        """``fetch`` from a job hash read already (``data``: HGETALL's), with the same refusals."""
        _refuse_colon(id)
        if not data:
            raise MalformedJob("the queue entry names no job hash")
        job = cls(id, connection=connection, serializer=serializer)
        job.restore(data)
        return job


def _refuse_colon(id: str) -> None:
    if ":" in id:
        # RQ reads "<job>:<execution>" as an execution key and would load the job <job> instead.
        raise ValueError("Job ID must only contain letters, numbers, underscores and dashes")


class EntryRefused(Exception):
    """A queue entry that is not a loadable job; ``job_id`` is its text, ``raw`` its bytes."""

    def __init__(self, job_id: str, raw: bytes, reason: str) -> None:
        super().__init__(reason)
        self.job_id, self.raw, self.reason = job_id, raw, reason


class SeamWorker(SimpleWorker):
    """RQ's in-process worker loop, hardened for short idempotent jobs; see the module docstring.

    Subclasses implement ``run_job`` with ``start``, ``run_in_time``, ``finish`` and ``fail``,
    ``refuse_entry`` for queue entries RQ cannot load, and ``job_ended`` for jobs RQ failed for good.
    """

    abandoned_after: int = 30
    job_ttl: int | None = None  # caps how long a finished job is kept, whatever its hash asks
    _holding: bool = False  # a job may be out of the queue and not finished yet
    stop_signalled: bool = False  # SIGTERM/SIGINT asked this worker to stop
    _beat_at: float = float("-inf")  # time.monotonic() of this worker's last own heartbeat
    _unsuspended: bool = False  # the last job's finish found no `rq suspend` in force
    _finishing: Execution | None = None  # the execution a finish in flight cleans up
    _front: bytes | None = None  # the queue's front entry when the last job finished (one queue only)

    def refuse_entry(self, entry: EntryRefused) -> None:
        raise NotImplementedError

    def maintain(self) -> None:
        """The subclass's own part of each maintenance pass (after RQ's); nothing by default."""

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
        self.increment_successful_job_count(pipeline=pipe)
        self.increment_total_working_time(job.ended_at - job.started_at, pipe)
        job._handle_success(result_ttl, pipeline=pipe, worker_name=self.name, execution_id=execution.id,
                            execution_started_at=execution.created_at, execution_ended_at=job.ended_at)
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

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stop_signalled = True
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

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
        """One round trip: the heartbeat, and whether the worker is still registered.

        A server that restarted empty lost the worker's registration: it registers again, so that
        ``health`` and ``rq info`` see a worker that is serving. The registration's ``birth`` field
        is the test, not the worker hash: a job's bookkeeping writes the hash, and would recreate
        it (registration writes the hash with ``birth`` and RQ's worker sets in one transaction).
        """
        with self.connection.pipeline(transaction=False) as pipe:
            pipe.hexists(self.key, "birth")
            super().heartbeat(None, pipe)
            registered = pipe.execute()[0]
        if not registered:
            log.warning("worker %s was no longer registered (a server that lost its data?); registering again",
                        self.name)
            self.connection.delete(self.key)  # a hash rewritten by a job's bookkeeping is not a registration
            self.register_birth()  # type: ignore[no-untyped-call]
            super().set_state(self._state)  # RQ's registration does not record the state
        self._beat_at = time.monotonic()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is None and state == self._state:
            return  # already recorded (the job's last pipeline sets IDLE)
        super().set_state(state, pipeline)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        """RQ's dequeue loop, made safe for a fork worker.

        * From the moment a job may leave the queue until it is done, a stop request only sets a
          flag; blocking waits are short, so an idle worker still stops within a second.
        * A queue entry RQ cannot load is handed to ``refuse_entry``, never raised.
        """
        self.set_state(WorkerStatus.IDLE)
        idle_since = time.monotonic()
        while True:
            if self._stop_requested:
                raise StopRequested()
            self.heartbeat()
            if self.should_run_maintenance_tasks:
                self.run_maintenance_tasks()
            wait = None if timeout is None else max(1, min(timeout, _IDLE_POLL))
            self._holding = True
            front, self._front = self._front, None
            try:
                result = self.until_up(functools.partial(self._dequeue, wait, front))
            except DequeueTimeout:
                self._holding = False
                if max_idle_time is not None and time.monotonic() - idle_since > max_idle_time:
                    return None
                continue
            except StopRequested:
                self._holding = False
                raise
            except Exception as exc:
                self._holding = False
                self.until_up(functools.partial(self.refuse_entry, _entry_of(exc)))
                continue
            if result is None:
                self._holding = False
                return None
            return result

    def _dequeue(self, wait: int | None, front: bytes | None) -> Any:
        """RQ's dequeue (``Queue.dequeue_any``), after one try at the entry the last job's finish saw
        at the queue's front: LMOVE and that entry's job hash in one round trip (``_dequeue_front``)."""
        if front is not None:
            found = self._dequeue_front(front)
            if found is not None:
                return found
        return self.queue_class.dequeue_any(self._ordered_queues, wait, connection=self.connection,
                                            job_class=_DequeuedJob, serializer=self.serializer,
                                            death_penalty_class=self.death_penalty_class)

    def _dequeue_front(self, front: bytes) -> Any:
        """RQ's non-blocking dequeue of the one queue (LMOVE to its intermediate queue), pipelined
        with HGETALL of ``front``'s job hash: the job, when the entry moved is ``front`` (else its
        hash is read as RQ does); ``None`` when the queue is empty. A failure carries ``job_id`` and
        ``queue``, as RQ's dequeue's do."""
        queue = self.queues[0]
        pipe = self.connection.pipeline(transaction=False)
        pipe.lmove(queue.key, queue.intermediate_queue_key)
        pipe.hgetall(self.job_class.key_for("").encode() + front)
        moved, data = pipe.execute()
        if moved is None:
            return None
        job_id = moved.decode()  # not text: refused as RQ's dequeue's UnicodeDecodeError is
        queue = self.queue_class.from_queue_key(queue.key, connection=self.connection, job_class=_DequeuedJob,
                                                serializer=self.serializer,
                                                death_penalty_class=self.death_penalty_class)
        try:
            if moved == front:
                return _DequeuedJob.loaded(job_id, data, self.connection, self.serializer), queue
            return _DequeuedJob.fetch(job_id, connection=self.connection, serializer=self.serializer), queue
        except Exception as exc:
            exc.job_id = job_id  # type: ignore[attr-defined]
            exc.queue = queue  # type: ignore[attr-defined]
            raise

    def _shutdown(self) -> None:
        # Called from the signal handler. Never raise here (RQ does): the exception would land
        # at any instruction, even inside redis-py between a command and its reply. The flag is
        # read before each dequeue and each blocking wait is short (an idle worker stops within
        # a second); a job in hand is finished first.
        self._stop_requested = True

    def check_for_suspension(self, burst: bool) -> None:
        # Right after a job, the job's last pipeline has just read the suspension key: RQ's own
        # check (a round trip, with a heartbeat the job's pipelines sent too) would read it again.
        if self._unsuspended:
            self._unsuspended = False
            return
        # RQ's loop calls this outside any guard: a Redis time-out there would end the worker.
        self.until_up(lambda: super(SeamWorker, self).check_for_suspension(burst))

    def teardown(self) -> None:
        # Unregistering is best effort: a stop must not fail because Redis is away or slow
        # (the registration expires on its own).
        try:
            super().teardown()  # type: ignore[no-untyped-call]
        except RedisError as exc:
            log.warning("could not unregister worker %s: %s", self.name, exc)

    def remove_entry(self, entry: EntryRefused) -> None:
        """Take a refused entry out of the intermediate queues, and delete its job hash if any:
        nothing of a refused entry stays in Redis (its outcome lives in the outcome record)."""
        pipe = self.connection.pipeline(transaction=False)
        for queue in self.queues:
            pipe.lrem(queue.intermediate_queue_key, 1, entry.raw)  # type: ignore[arg-type]  # bytes are fine
        # From the raw bytes: an entry that is not UTF-8 may still name a job hash.
        pipe.delete(self.job_class.key_for("").encode() + entry.raw)
        pipe.execute()

    def run_maintenance_tasks(self) -> None:
        # RQ's loop calls this too, outside any guard: an outage here must pause, not quit.
        self.until_up(self._maintain)

    def _maintain(self) -> None:
        try:
            self._purge_undecodable()
            self._requeue_stranded()
            super().run_maintenance_tasks()  # type: ignore[no-untyped-call]
            self.maintain()
        except StopRequested:
            raise
        except Exception as exc:
            if is_outage(exc):
                raise  # until_up backs off and runs the pass again
            # A malformed entry in an RQ registry must not stop the worker; the next pass retries.
            log.exception("maintenance pass failed")
            self.last_cleaned_at = now()  # type: ignore[assignment]

    def _purge_undecodable(self) -> None:
        # RQ decodes every entry of the intermediate queue as text; one non-UTF-8 entry would
        # break every maintenance pass of every worker. It can never be a job: drop it.
        for queue in self.queues:
            for raw in self.connection.lrange(queue.intermediate_queue_key, 0, -1):
                if isinstance(raw, bytes) and not _is_text(raw):
                    self.refuse_entry(EntryRefused("", raw, "queue entry is not UTF-8 text"))

    def _requeue_stranded(self) -> None:
        # A worker killed between dequeue and start leaves its job in RQ's intermediate queue,
        # which RQ itself recovers only after minutes (and fails it if no retry is left). A job
        # seen there, not started, for ``abandoned_after`` seconds goes back to the queue's front.
        for queue in self.queues:
            stranded = queue.intermediate_queue
            started = queue.started_job_registry
            for job_id in stranded.get_job_ids():
                if job_id in started or stranded.set_first_seen(job_id):
                    continue
                first = stranded.get_first_seen(job_id)
                if first is None or (now() - first).total_seconds() < self.abandoned_after:
                    continue
                if self._requeue(keys=[stranded.key, queue.key], args=[job_id]):
                    self.connection.delete(stranded.get_first_seen_key(job_id))
                    log.warning("job %s was stranded by a dead worker; requeued", job_id)

    @functools.cached_property
    def _requeue(self) -> Any:
        return self.connection.register_script(_REQUEUE)

    def clean_registries(self) -> None:
        # RQ's version, except that the maintenance lock is released even when Redis drops midway
        # (RQ would leave it for 15 minutes, and no worker would recover abandoned jobs meanwhile).
        for queue in self.queues:
            if queue.acquire_maintenance_lock():
                try:
                    clean_registries(queue, self._exc_handlers)
                    worker_registration.clean_worker_registry(queue)
                    queue.intermediate_queue.cleanup(self, queue)
                finally:
                    try:
                        queue.release_maintenance_lock()  # type: ignore[no-untyped-call]
                    except Exception as exc:
                        if not is_outage(exc):
                            raise
                        log.warning("could not release the maintenance lock of %s; it expires", queue.name)
        self.last_cleaned_at = now()  # type: ignore[assignment]

    def until_up(self, step: Callable[[], T]) -> T:
        """Run ``step``; while Redis is unreachable, back off and run it again (steps are idempotent)."""
        delay = 0.1
        while True:
            try:
                return step()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if self._stop_requested:
                    raise StopRequested() from exc
                log.warning("Redis unreachable or busy (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
                time.sleep(delay)  # back-off, not synchronisation
                delay = min(delay * 2, 5.0)


# Move a job stranded by a dead worker from RQ's intermediate queue back to its queue's front,
# atomically: it is never in neither list (and a job that a live worker took meanwhile is left).
# KEYS = rq:queue:<name>:intermediate, rq:queue:<name>; ARGV = job id. Returns 1 when moved.
_REQUEUE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"""


def _is_text(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _entry_of(exc: Exception) -> EntryRefused:
    """What RQ's dequeue failed on: a job id it refuses, a malformed hash, bytes that are not text."""
    if isinstance(exc, UnicodeDecodeError):
        return EntryRefused("", bytes(exc.object), "queue entry is not UTF-8 text")
    job_id = getattr(exc, "job_id", None)
    if job_id is None:
        raise exc
    text = str(job_id)
    # The reason does not repeat the id (the outcome carries it, escaped and bounded).
    return EntryRefused(text, text.encode(errors="surrogateescape"),
                        f"queue entry is not a loadable sessionfork job ({type(exc).__name__}: {_bounded(exc)})")


def _bounded(exc: Exception) -> str:
    return repr(str(exc)[:200])[1:-1]

