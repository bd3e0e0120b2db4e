"""``SeamWorker``: the one subclass of RQ's ``SimpleWorker``, holding every override of an RQ worker
method. RQ's in-process loop made safe for short idempotent jobs: a stop request never strands a
job, a queue entry RQ cannot load is refused, a Redis outage pauses the loop (``until_up``), and a
job's RQ bookkeeping rides the request's own round trips (``riders``). Every RQ name used here is
listed, with its reason, in the package docstring (``sessionfork.worker.rq_seam``); the job classes
are in ``entries``."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

from redis.exceptions import RedisError
from rq import SimpleWorker, worker_registration
from rq.exceptions import DequeueTimeout, StopRequested
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

from ...core import lua
from ...core.connections import stop_retrying
from ...core.outages import is_outage
from ...core.settings import Settings
from .entries import DequeuedJob, EntryRefused, Taken, entry_of, is_text
from .ledger import SCRIPTS as LEDGER_SCRIPTS
from .ledger import Ledger

T = TypeVar("T")
log = logging.getLogger("sessionfork.worker")
RQ_MAJOR = int(VERSION.split(".")[0])
DEFAULT_BATCH = Settings().batch
"""Most entries a worker takes at once unless told (``SESSIONFORK_BATCH``'s default)."""
_HEARTBEAT_EVERY = 1.0
_IDLE_POLL = 1  # seconds an idle worker blocks waiting for a job before it looks at its stop flag
SCRIPTS = lua.table(lua.Spec("take", ("queue", "held"), ("count", "prefix"), __package__),
                    lua.Spec("last", ("held",), ("prefix",), __package__))
"""The seam's own scripts (``scripts/take.lua``, ``scripts/last.lua`` of this package)."""


class SeamWorker(SimpleWorker):
    """RQ's in-process worker loop, hardened for short idempotent jobs; see the module docstring.

    Every method RQ defines that this worker changes is overridden here, and only here. What the
    jobs are is its one subclass's business, told through the hooks below (none of them an RQ
    name): ``run_batch`` (with ``start``, ``run_in_time``, ``finish`` and ``fail``), ``refuse_entry``,
    ``maintain``, ``job_ended`` and ``redis_clients``.
    """

    abandoned_after: int = 30
    job_ttl: int | None = None  # caps how long a finished job is kept, whatever its hash asks
    stop_signalled: bool = False  # SIGTERM/SIGINT asked this worker to stop
    unreachable_at_stop: bool = False  # the loop stopped on a step that found Redis unreachable
    _front: bytes | None = None  # the queue's front entry when the last job finished (one queue only)
    _empty: bool = False  # the one queue was empty when the last job finished (no take before the wait)
    _beat_at: float = float("-inf")  # time.monotonic() of this worker's last own heartbeat
    _unsuspended: bool = False  # the last job's finish found no `rq suspend` in force
    # RQ's worker counters not sent yet (successful jobs, working time): batched into the beat.
    _unsent_jobs: int = 0
    _unsent_time: float = 0.0
    _flushing: tuple[int, float] = (0, 0.0)  # the counters a pipeline in flight adds
    batch: int = DEFAULT_BATCH  # entries one dequeue takes at most when more wait (``take``; 1: RQ's dequeue only)
    _jobs_left: int | None = None  # ``work(max_jobs=...)``'s budget not dequeued yet (None: no limit)

    # -- hooks: what the subclass implements (no RQ name) ----------------------------------------

    def run_batch(self, jobs: list[Job], queue: Queue) -> None:
        """Run the jobs of one dequeue (one job, or those one ``take`` moved to the intermediate
        queue), each still to start, with ``start``, ``run_in_time``, ``finish`` and ``fail``."""
        raise NotImplementedError

    def refuse_entry(self, entry: EntryRefused) -> None:
        """A queue entry RQ cannot load: give it its outcome, then ``remove_entry``."""
        raise NotImplementedError

    def maintain(self) -> None:
        """The subclass's own part of each maintenance pass (after RQ's); nothing by default."""

    def job_ended(self, job: Job) -> None:
        """Called once RQ has failed ``job`` for good (no retry follows)."""

    def redis_clients(self) -> list[Any]:
        """The Redis clients this worker's steps use (their retries end at a stop request)."""
        return [self.connection]

    def __init__(self, *args: Any, batch: int = DEFAULT_BATCH, **kwargs: Any) -> None:
        """RQ's worker, taking up to ``batch`` queued entries at once (see ``batch``; by default
        ``SESSIONFORK_BATCH``'s, as ``sessionfork worker`` runs)."""
        super().__init__(*args, **kwargs)
        self.batch = batch
        self._ledgers: dict[str, Ledger] = {}  # by queue name

    # -- the loop: start-up, stop, suspension, heartbeat, teardown ---------------------------------

    def work(self, *args: Any, **kwargs: Any) -> bool:
        # RQ counts one per ``execute_job``, a batch too: ``max_jobs`` (a keyword, as the CLI
        # passes it) is counted per job here, and the dequeue ends the loop once it is spent.
        self._jobs_left = kwargs.get("max_jobs")
        return bool(super().work(*args, **kwargs))

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        # RQ registers the worker before it installs its signal handlers: a SIGTERM in between
        # would kill it uncleanly. Install them first; a stop during start-up is a clean stop.
        self._install_signal_handlers()  # type: ignore[no-untyped-call]
        try:
            super().bootstrap(*args, **kwargs)
        except StopRequested:
            self._stop_requested = True

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stop_signalled = True
        # A warm stop whatever the servers' state: no command of a stopping worker rides out an
        # outage (with every sentinel gone, one command's retries took minutes), the one retrying
        # now included. A command that fails ends its step with StopRequested (``until_up``).
        for client in self.redis_clients():
            stop_retrying(client)
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

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
        self.until_up(functools.partial(super().check_for_suspension, burst))

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is None and state == self._state:
            return  # already recorded (the job's last pipeline sets IDLE)
        super().set_state(state, pipeline)

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
        # Unregistering is best effort: a stop must not fail because Redis is away or slow
        # (the registration expires on its own). Away when the loop stopped: not even tried
        # (each command would wait out its connect time-out, per sentinel behind Sentinel).
        if self.unreachable_at_stop:
            log.warning("worker %s stopped with Redis unreachable: not unregistered (its registration "
                        "expires on its own)", self.name)
            if self.pubsub_thread is not None:  # RQ's command listener: a daemon thread, told to end
                self.pubsub_thread.stop(timeout=0)  # not waited for: its read ends with its connection
            return
        # The counters of the jobs since the last beat, before RQ unregisters the worker (best
        # effort, like the unregistering: a worker killed instead loses at most a second's worth).
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                self.flush_counters(pipe)
                pipe.execute()
            self.counters_sent()
        except RedisError as exc:
            log.warning("could not send the counters of worker %s: %s", self.name, exc)
        try:
            super().teardown()  # type: ignore[no-untyped-call]
        except RedisError as exc:
            log.warning("could not unregister worker %s: %s", self.name, exc)

    def unsubscribe(self) -> None:
        """RQ's end of its command listener, the listener told to end before the ``UNSUBSCRIBE``
        whose confirmation wakes it. RQ unsubscribes first, then calls ``stop()``, which since
        redis-py 8.2 waits for the listener's thread: when the confirmation woke the listener
        before the stop, it was back in its 60-second read, and the worker's stop waited it out
        (SIGTERMed workers were killed waiting). Waited for 1 s at most, as RQ waits."""
        thread = self.pubsub_thread
        if thread is None:
            return
        thread.stop(timeout=0)  # the flag only: the confirmation below ends the listener's read, and its loop
        try:
            self.pubsub.unsubscribe()
        except RedisError as exc:  # best effort, as the rest of the teardown
            log.warning("could not unsubscribe worker %s from its command channel: %s", self.name, exc)
        thread.join(timeout=1)
        self.pubsub.close()

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
                    self.unreachable_at_stop = True
                    raise StopRequested() from exc
                log.warning("Redis unreachable or busy (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
                time.sleep(delay)  # back-off, not synchronisation
                delay = min(delay * 2, 5.0)

    # -- the dequeue -------------------------------------------------------------------------------

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        """RQ's dequeue loop, made safe for a fork worker.

        * A stop request only sets a flag, read here before each dequeue: a job that left the
          queue is always run; blocking waits are short, so an idle worker still stops within a
          second.
        * A queue entry RQ cannot load is handed to ``refuse_entry``, never raised.
        * An idle worker checks the suspension (a paused shard: ``rq suspend``) after each wait,
          so a pause holds within a second, not only between jobs.
        * The entry the last job's finish saw at the queue's front is dequeued with its job hash
          in one round trip (``_dequeue_front``); a wait for a job reads the job's hash in its own
          round trip (``_dequeue_waiting``), and starts at once when the last finish saw the queue
          empty.
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
            front, self._front = self._front, None
            empty, self._empty = self._empty, False
            try:
                result = self.until_up(functools.partial(self._dequeue, wait, front, empty))
            except DequeueTimeout:
                if max_idle_time is not None and time.monotonic() - idle_since > max_idle_time:
                    return None
                # RQ checks the suspension before its dequeue loop only: an idle worker would
                # take the next job of a paused queue. Checked after each idle wait (a second).
                self.check_for_suspension(False)
                continue
            except StopRequested:
                raise
            except Exception as exc:
                self.until_up(functools.partial(self.refuse_entry, entry_of(exc)))
                continue
            return result

    def _dequeue(self, wait: int | None, front: bytes | None, empty: bool) -> Any:
        """The next job (or ``Taken`` entries), counted against ``work``'s ``max_jobs``; ``None``
        once that budget is spent (RQ's loop then ends)."""
        if self._jobs_left is not None and self._jobs_left <= 0:
            return None
        found = self._dequeue_next(wait, front, empty)
        if found is not None and self._jobs_left is not None:
            self._jobs_left -= len(found[0].entries) if isinstance(found[0], Taken) else 1
        return found

    def _dequeue_next(self, wait: int | None, front: bytes | None, empty: bool) -> Any:
        """Several queues: RQ's dequeue (``Queue.dequeue_any``). One queue: with ``batch`` above 1,
        up to ``batch`` waiting entries in one round trip (``take``); else one try at the entry
        the last job's finish saw at the queue's front (LMOVE and that entry's job hash in one
        round trip: ``_dequeue_front``). When none waits, or the last finish saw the queue
        ``empty``: the wait for the next entry, which reads its job hash in the same round trip
        (``_dequeue_waiting``: a lone request served at once)."""
        if len(self.queues) != 1:
            return self.queue_class.dequeue_any(self._ordered_queues, wait, connection=self.connection,
                                                job_class=DequeuedJob, serializer=self.serializer,
                                                death_penalty_class=self.death_penalty_class)
        if empty:
            pass  # nothing waited a moment ago: straight to the wait, no take or LMOVE to find it out
        elif self.batch > 1:
            taken = self.take(self._take_count)
            if taken.entries:
                return taken, self.queues[0]
        elif front is not None:
            found = self._dequeue_front(front)
            if found is not None:
                return found
        return self._dequeue_waiting(wait)

    @property
    def _take_count(self) -> int:
        """The most entries the next dequeue takes: ``batch``, within ``work``'s ``max_jobs`` budget."""
        return self.batch if self._jobs_left is None else min(self.batch, self._jobs_left)

    def take(self, count: int) -> Taken:
        """Up to ``count`` entries off the one queue's head, moved to its intermediate queue with
        their job hashes in one atomic script call (``scripts/take.lua``): RQ's dequeue, for many."""
        queue = self.queues[0]
        raw = self._scripts("take", queue=queue.key, held=queue.intermediate_queue_key, count=count,
                            prefix=self.job_class.key_for(""))
        return Taken(_taken(raw))

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
        return self._dequeued(moved, data if moved == front else None)

    def _dequeue_waiting(self, wait: int | None) -> Any:
        """RQ's dequeue of the one queue (``Queue.lmove``: BLMOVE to its intermediate queue for up
        to ``wait`` seconds, LMOVE with no ``wait``), pipelined with the intermediate queue's last
        entry and its job hash (``scripts/last.lua``, sent as ``EVAL``), and with batches, a
        ``take`` of up to ``batch - 1`` more: the requests that arrived with the one that woke the
        worker run in its batch. The moved entry's job is built from that hash when the entry is
        the one moved (another worker's move may land between the two; then, or when the script
        failed, its hash is read as RQ does). ``None`` when nothing was moved or taken and ``wait``
        is ``None``; RQ's ``DequeueTimeout`` when ``wait`` passed with nothing. Entries moved by a
        round trip that then fails (the take's error reply, an outage before that hash is read)
        stay in the intermediate queue, requeued as stranded (``abandoned_after``)."""
        queue = self.queues[0]
        prefix = self.job_class.key_for("")
        more = self._take_count - 1
        pipe = self.connection.pipeline(transaction=False)
        if wait is None:
            pipe.lmove(queue.key, queue.intermediate_queue_key)
        else:
            pipe.blmove(queue.key, queue.intermediate_queue_key, wait)
        # Each an EVAL of its few words: a wait never meets NOSCRIPT. The last entry is read before
        # the take pushes more behind it.
        ops = [self._scripts.op("last", held=queue.intermediate_queue_key, prefix=prefix)]
        if self.batch > 1 and more > 0:
            ops.append(self._scripts.op("take", queue=queue.key, held=queue.intermediate_queue_key, count=more,
                                        prefix=prefix))
        lua.add(pipe, ops, loaded=True)
        moved, found, *rest = pipe.execute(raise_on_error=False)
        if isinstance(moved, Exception):
            raise moved
        try:
            taken = _taken(rest[0]) if rest else []
        except RedisError:
            if moved is None:
                raise
            taken = []  # the woken job runs alone; what the take moved is requeued as stranded
        if moved is None and not taken:  # (a take finds entries only when pushed after the wait gave up)
            if wait is None:
                return None
            raise DequeueTimeout(wait, queue.key)
        ok = isinstance(found, list) and len(found) == 2 and found[0] == moved
        data = _pairs(found[1]) if ok else None
        if not taken:
            assert moved is not None
            return self._dequeued(moved, data)
        if moved is not None:
            hash_ = data if data is not None else cast("dict[bytes, bytes]",
                                                        self.connection.hgetall(prefix.encode() + moved))
            taken.insert(0, (moved, hash_))
        return Taken(taken), self.queues[0]

    def _dequeued(self, moved: bytes, data: dict[bytes, bytes] | None) -> Any:
        """The job of the entry ``moved`` to the intermediate queue and its queue: built from
        ``data`` (its job hash, read with the move), else fetched as RQ's dequeue fetches it. A
        failure carries ``job_id`` and ``queue``, as RQ's dequeue's do."""
        job_id = moved.decode()  # not text: refused as RQ's dequeue's UnicodeDecodeError is
        queue = self.queue_class.from_queue_key(self.queues[0].key, connection=self.connection,
                                                job_class=DequeuedJob, serializer=self.serializer,
                                                death_penalty_class=self.death_penalty_class)
        try:
            if data is not None:
                return DequeuedJob.loaded(job_id, data, self.connection, self.serializer), queue
            return DequeuedJob.fetch(job_id, connection=self.connection, serializer=self.serializer), queue
        except Exception as exc:
            exc.job_id = job_id  # type: ignore[attr-defined]
            exc.queue = queue  # type: ignore[attr-defined]
            raise

    def remove_entry(self, entry: EntryRefused) -> None:
        """Take a refused entry out of the intermediate queues, and delete its job hash if any:
        nothing of a refused entry stays in Redis (its outcome lives in the outcome record)."""
        pipe = self.connection.pipeline(transaction=False)
        for queue in self.queues:
            pipe.lrem(queue.intermediate_queue_key, 1, entry.raw)  # type: ignore[arg-type]  # bytes are fine
        # From the raw bytes: an entry that is not UTF-8 may still name a job hash.
        pipe.delete(self.job_class.key_for("").encode() + entry.raw)
        pipe.execute()

    # -- a job: run, start, finish, failure ----------------------------------------------------------

    def execute_job(self, job: Job | Taken, queue: Queue) -> None:
        """RQ's documented hook: run one dequeued job, or the entries one ``take`` moved (after
        refusing those that are not loadable jobs), in this process (``run_batch``)."""
        if not isinstance(job, Taken):
            self.run_batch([job], queue)
            return
        jobs: list[Job] = []
        for raw, data in job.entries:
            try:
                jobs.append(DequeuedJob.loaded(raw.decode(), data, self.connection, self.serializer))
            except Exception as exc:
                if not isinstance(exc, UnicodeDecodeError):
                    exc.job_id = raw.decode()  # type: ignore[attr-defined]
                # Refused alone: the batch's other entries run.
                self.until_up(functools.partial(self.refuse_entry, entry_of(exc)))
        if jobs:
            self.run_batch(jobs, queue)

    def run_in_time(self, job: Job, step: Callable[[], T]) -> T:
        """Run ``step`` under the job's timeout (RQ's ``JobTimeoutException`` when it runs over)."""
        with self.death_penalty_class(job.timeout or self.queue_class.DEFAULT_TIMEOUT,
                                      JobTimeoutException, job_id=job.id):
            return step()

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # The started-registry entry expires this long after the last heartbeat; a job whose
        # worker died is then abandoned and recovered by the next maintenance pass.
        return self.abandoned_after

    def start(self, jobs: Sequence[Job], queue: Queue, pipe: Any,
              again: Sequence[Execution] = ()) -> list[Execution]:
        """RQ's start of each of ``jobs`` (a batch; a lone job: a batch of one), added to ``pipe``
        (``riders.Started``: ahead of the batch's claims, in their round trip): each job's start, written by
        the ``ledger``, then the worker's own state once (busy, with the last job as RQ 2's
        current job, as after starting each in turn); each job's execution, in job order
        (``finish`` takes them back; a job twice in a batch, an entry queued twice, has two,
        each cleaned up by its own finish). ``again``: the executions of the same start sent
        before, whose reply was lost (``Ledger.start``: the same ids written again)."""
        call, executions = self._ledger(queue).start(jobs, self.get_heartbeat_ttl(jobs[0]), again)
        lua.add_loaded(pipe, call)
        self._busy(jobs[-1], pipe)  # after the executions, as RQ's prepare_execution: its heartbeat sets their TTL
        return executions

    def _busy(self, job: Job, pipe: Any) -> None:
        super().set_state(WorkerStatus.BUSY, pipeline=pipe)
        if RQ_MAJOR < 3:
            getattr(self, "set_current_job_id")(job.id, pipeline=pipe)  # noqa: B009 - gone in RQ 3
        super().heartbeat(self.get_heartbeat_ttl(job), pipeline=pipe)

    def finish(self, jobs: Sequence[Job], queue: Queue, results: Sequence[Any],
               executions: Sequence[Execution], pipe: Any, last: bool = True) -> float:
        """RQ's success of each of ``jobs`` (a batch started by ``start``, whose ``executions`` it
        returned: result, finished registry, cleanup) with its result, added to ``pipe``
        (``riders.Finished``: after the outcomes' records, in their transaction), the worker's own
        state once, with a read of whether ``rq suspend`` is in force (the loop's next suspension
        check); returns the
        jobs' working time (seconds). Its sender then calls ``finished`` with the replies (and
        the same ``last``). ``last=False``: a later batch of this worker's has started already
        (batches overlap): the worker stays busy with it, RQ 2's current job its, and the queue's
        front is read by that batch's finish."""
        # The ledger writes the jobs whose result TTL is positive (a fork job's, always); RQ's own
        # methods any other (see ``ledger``).
        ttls = [self._result_ttl(job) for job in jobs]
        kept_for = next((ttl for ttl in ttls if isinstance(ttl, int) and ttl > 0), None)  # one TTL per call
        kept = [i for i, ttl in enumerate(ttls) if kept_for is not None and ttl == kept_for]
        if kept_for is not None:
            lua.add_loaded(pipe, self._ledger(queue).finish([jobs[i] for i in kept], [results[i] for i in kept],
                                                            [executions[i] for i in kept], kept_for, last))
        for i in sorted(set(range(len(jobs))) - set(kept)):
            self._finish_job(jobs[i], results[i], pipe, executions[i])
        if last:
            self._idle(pipe)
        return sum((job.ended_at - job.started_at).total_seconds() for job in jobs
                   if job.ended_at is not None and job.started_at is not None)

    def _ledger(self, queue: Queue) -> Ledger:
        """This worker's ``Ledger`` of ``queue`` (built once per queue)."""
        ledger = self._ledgers.get(queue.name)
        if ledger is None:
            ledger = self._ledgers[queue.name] = Ledger(
                worker_name=self.name, worker_key=self.key, started=queue.started_job_registry.key,
                finished=queue.finished_job_registry.key, held=queue.intermediate_queue_key,
                serializer=self.serializer, rq_major=RQ_MAJOR, scripts=self._ledger_scripts)
        return ledger

    def _finish_job(self, job: Job, result: Any, pipe: Any, execution: Execution) -> float:
        assert job.started_at is not None
        job.ended_at = now()
        job._result = result
        result_ttl = self._result_ttl(job)
        job._handle_success(result_ttl, pipeline=pipe, worker_name=self.name, execution_id=execution.id,
                            execution_started_at=execution.created_at, execution_ended_at=job.ended_at)
        if result_ttl is not None and result_ttl > 0:
            # RQ's cleanup, less its EXPIREs of the dependents and dependencies keys: a fork job
            # has neither (nothing enqueues one with depends_on, and the finish enqueues no dependents).
            pipe.expire(job.key, result_ttl)
        else:
            job.cleanup(result_ttl, pipeline=pipe, remove_from_queue=False)
        self._cleanup_execution(job, pipe, execution)
        return (job.ended_at - job.started_at).total_seconds()

    def _idle(self, pipe: Any) -> None:
        super().set_state(WorkerStatus.IDLE, pipeline=pipe)
        if self._reads_front:
            # The next job's id, likely (its hash comes with the next dequeue); none: the queue is
            # empty, and the next dequeue starts its wait at once.
            pipe.lindex(self.queues[0].key, 0)
        pipe.exists(WORKERS_SUSPENDED)

    @property
    def _reads_front(self) -> bool:
        """Whether a finish reads the queue's front for the next dequeue: one queue (the entry for
        ``_dequeue_front`` one job at a time; with batches, only whether one waits)."""
        return len(self.queues) == 1

    def finished(self, replies: list[Any], jobs: int, worked: float, last: bool = True) -> None:
        """``finish``'s commands ran (``replies``: theirs; the last two: the queue's front entry,
        when ``_reads_front``, and the suspension key) for ``jobs`` jobs that worked ``worked``
        seconds (``last`` as given to ``finish``: when False, no state of the worker's was read,
        the later batch's finish reads it)."""
        self._unsent_jobs += jobs
        self._unsent_time += worked
        if not last:
            return
        if RQ_MAJOR >= 3:
            self.execution = None
        self._front = replies[-2] if self._reads_front else None
        self._empty = self._reads_front and self._front is None
        self._unsuspended = not replies[-1]

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
        if RQ_MAJOR < 3:
            self.execution = execution  # RQ 2 cleans up the worker's current execution
        self.cleanup_execution(job, pipeline=pipe, **extra)

    # -- maintenance ---------------------------------------------------------------------------------

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
                if isinstance(raw, bytes) and not is_text(raw):
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
    def _scripts(self) -> lua.Scripts:
        return lua.Scripts(self.connection, SCRIPTS)

    @functools.cached_property
    def _ledger_scripts(self) -> lua.Scripts:
        return lua.Scripts(self.connection, LEDGER_SCRIPTS)

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


def _taken(raw: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """``take.lua``'s reply as ``Taken`` entries (an error reply: raised)."""
    if isinstance(raw, Exception):
        raise raw
    return [(raw[i], _pairs(raw[i + 1])) for i in range(0, len(raw), 2)]


def _pairs(flat: list[Any]) -> dict[bytes, bytes]:
    """HGETALL's reply as a script returns it (a flat list) as redis-py's mapping."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


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
