"""``RequestWorker``: an RQ worker that runs fork requests in-process and refuses any other job.

What it does differently from ``rq worker``:

* no work-horse process per job (forks are O(1) and short): like RQ's ``SimpleWorker``, it keeps
  RQ's started/finished/failed registries, retries and abandoned-job recovery; it runs requests
  in batches (a lone job: a batch of one), and RQ's bookkeeping for a batch rides its own round
  trips (start with the claims, finish in the records' transaction) instead of taking a dozen of
  its own per job;
* it never imports the job's callable: a job must name ``sessionfork.jobs.fork`` with one string
  argument, else it is refused (``INVALID_REQUEST``, job failed, nothing run);
* every job that ends for good leaves its request one outcome: a job RQ fails (retries spent, an
  abandoned job, a job stuck in the intermediate queue) is finished by running its idempotent
  request once more, or refused;
* its loop is ``rq_seam.worker.SeamWorker``'s: stops never strand a job, bad queue entries
  and Redis outages never stop the worker.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from rq import Queue
from rq.exceptions import AbandonedJobError
from rq.job import Job

from ..core import retention
from ..core.factories import now_ms
from ..core.wire import Outcome
from . import jobs
from .rq_seam.entries import EntryRefused, ForkJob
from .rq_seam.riders import Finished, Started
from .rq_seam.worker import SeamWorker
from .service import Flight, Prepared, RequestService

log = logging.getLogger("sessionfork.worker")

OutcomeHook = Callable[[str, str, Outcome, float, float | None], None]
"""``on_outcome(request_id, payload, reply, seconds, latency)``: called once per outcome the worker
produces, with its run time and its enqueue-to-outcome latency (seconds; ``None`` when unknown)."""


class _Refused(Exception):
    """A job that is not a sessionfork request; never run."""


class RequestWorker(SeamWorker):
    """Runs ``sessionfork.jobs.fork`` jobs with ``service``; see the module docstring.

    It overrides no method of RQ's worker (those are all ``SeamWorker``'s): it fills the hooks
    ``SeamWorker`` calls, ``run_batch``, ``refuse_entry``, ``maintain``, ``job_ended`` and
    ``redis_clients``, and adds its own state in the constructor.
    """

    def __init__(self, queues: list[Queue], *, service: RequestService, abandoned_after: int,
                 job_ttl: int | None = None, retention: int = 0, branch_ttl: int = 0,
                 delete_after_persist: bool = False, on_outcome: OutcomeHook | None = None,
                 **kwargs: Any) -> None:
        super().__init__(queues, serializer=jobs.JSONSerializer, job_class=ForkJob, **kwargs)
        self.service = service
        self.abandoned_after = abandoned_after
        self.job_ttl = job_ttl
        self.retention = retention
        self.branch_ttl = branch_ttl
        self.delete_after_persist = delete_after_persist
        self.on_outcome = on_outcome
        self.push_exc_handler(self._finish_abandoned)  # type: ignore[no-untyped-call]  # rq leaves it untyped

    def redis_clients(self) -> list[Any]:
        return [self.connection, self.service.registry.redis, self.service.outcomes.redis]

    def run_batch(self, jobs: list[Job], queue: Queue) -> None:
        """Run the jobs of one dequeue (a lone job: a batch of one) in batches (``RequestService.begin``
        and ``end``: one round trip for every claim, one for every child step, one for each merge
        step, one transaction for every record; RQ's start bookkeeping of them all in the first,
        its success bookkeeping in the records' transaction). A batch is the jobs in queue order
        while their forks' children fit in the service's ``batch_children``; the job that does not
        fit starts the next batch. The batches overlap: the next one begins (its claims, its source
        steps, its child steps sent) before this one ends (its child steps' replies read, its
        records), so that the server creates one batch's children while the worker ends the batch
        before it; a batch with merges ends before the next begins (its merges' steps come before
        the next batch's source steps). Then each job that runs alone, as a batch of its own
        (``_run_alone``: a dequeue's only job, a request that runs alone, ``Prepared.alone``, a job
        refused), so that none of those holds a batch's replies. When a batch fails unexpectedly,
        each of its requests runs as a batch of its own (idempotent: a request done is a replay),
        as started already when its start was sent."""
        alone: list[tuple[Job, str, Prepared | None]] = []
        ahead: _Batch | None = None  # begun, not ended
        try:
            for items in self._batches(jobs, alone):
                batch = _Batch(self, items, queue)
                flight = self._begin(batch)
                if ahead is not None:  # the batch begun before this one ends now, this one in flight
                    self._end(ahead, last=flight is None)
                ahead = None
                if flight is None:
                    self._split(batch)
                elif flight.merging:  # its merges' steps come before the next batch's source steps
                    self._end(batch, last=True)
                else:
                    ahead = batch
        finally:  # an exception out of the loop (a bug preparing a job) still ends the batch in flight
            if ahead is not None:
                self._end(ahead, last=True)
        for job, payload, prepared in alone:
            if prepared is None:
                self._refuse(job, queue, payload)
            else:
                self._run_alone(_Batch(self, [(job, payload, prepared)], queue))

    def _batches(self, jobs: list[Job], alone: list[tuple[Job, str, Prepared | None]]
                 ) -> Iterator[list[tuple[Job, str, Prepared]]]:
        """The batches of ``jobs``, in queue order, each yielded as soon as it is complete: its jobs
        are prepared (``RequestService.prepare``: parsed and checked) one at a time, so that a batch is
        prepared while the server creates the children of the batch begun before it. A job that
        runs alone goes to ``alone`` (a job refused: with its reason, no request)."""
        most = self.service.batch_children
        items: list[tuple[Job, str, Prepared]] = []
        left = most  # what the current batch's forks may still create
        for job in jobs:
            try:
                payload = _payload(job)
            except _Refused as refused:
                alone.append((job, str(refused), None))
                continue
            prepared = self.service.prepare(payload, job.id, enqueued_ms=_enqueued_ms(job))
            if prepared.alone or len(jobs) == 1:
                alone.append((job, payload, prepared))
                continue
            if prepared.children > left:  # the next batch's first
                if items:
                    yield items
                items, left = [], most
            items.append((job, payload, prepared))
            left -= prepared.children
        if items:
            yield items

    def _begin(self, batch: _Batch) -> Flight | None:
        """Begin ``batch`` (``RequestService.begin``): its flight, also kept as ``batch.flight``;
        ``None`` when it failed (nothing left open)."""
        try:
            batch.flight = self.run_in_time(batch.shortest, lambda: self.until_up(lambda: self.service.begin(
                batch.prepared, start=batch.start)))
        except Exception:
            log.exception("a batch of %d requests failed; running each on its own", len(batch.items))
            return None
        return batch.flight

    def _end(self, batch: _Batch, *, last: bool) -> None:
        """End ``batch`` (``_ended``), then observe each outcome; ``last``: no later batch of this
        worker's has begun (``Finished.last``). A batch that fails runs each request on its own."""
        try:
            replies = self._ended(batch, last=last)
        except Exception:
            log.exception("a batch of %d requests failed; running each on its own", len(batch.items))
            self._split(batch)
            return
        self._observed(batch, replies)

    def _ended(self, batch: _Batch, *, last: bool) -> list[Outcome]:
        """``batch`` to its outcomes: its flight ended (``RequestService.end``), or, when it has none (a
        batch of its own, or after an outage), the whole batch run (``RequestService.run``,
        idempotent); RQ's finish of it sent on its own when the records went on another client."""
        finish = batch.finish
        finish.last = last

        def step() -> list[Outcome]:
            flight, batch.flight = batch.flight, None
            if flight is not None:
                return self.service.end(flight, finish=finish)
            return self.service.run(batch.prepared, start=batch.start, finish=finish, final_attempt=batch.final)

        try:
            replies = self.run_in_time(batch.shortest, lambda: self.until_up(step))
        except BaseException as exc:
            if batch.flight is not None:  # never ended (its end did not start): given up
                batch.flight.close(exc)
            raise
        if not finish.sent:  # the records went on another client: the finish goes on its own
            batch.start.ensure()
            self.until_up(lambda: self._finish_apart(finish, replies))
        return replies

    def _observed(self, batch: _Batch, replies: list[Outcome]) -> None:
        """Each of ``batch``'s outcomes observed, RQ's result of a job made the stored outcome when
        another attempt's was stored first."""
        seconds = time.perf_counter() - batch.began
        for (job, payload, _), reply, result in zip(batch.items, replies, batch.finish.results, strict=True):
            if result is not reply:  # another attempt's outcome was stored first: RQ's result is it
                self.execution = None
                self.until_up(lambda job=job, reply=reply: self.correct_result(job, reply))  # type: ignore[misc]
            self._observe(job.id, payload, reply, seconds, _latency(job))

    def _split(self, batch: _Batch) -> None:
        """Each request of a failed batch as a batch of its own, as started already when its start
        was sent."""
        for i, item in enumerate(batch.items):
            self._run_alone(_Batch(self, [item], batch.queue, batch.start.of(i)))

    def _run_alone(self, batch: _Batch) -> None:
        """A batch of one job (``batch.final``: on its last attempt), run to its outcome; its failure
        is its job's: RQ's failure path (a retry, or, on the last attempt, its ``INTERNAL`` outcome
        recorded first by the service)."""
        try:
            replies = self._ended(batch, last=True)
        except Exception:
            exc_info = sys.exc_info()
            (job, payload, _), start = batch.items[0], batch.start
            start.ensure()
            self.execution = start.executions[0]
            self.until_up(lambda: self.fail(job, batch.queue, "".join(traceback.format_exception(*exc_info)),
                                            exc_info=exc_info))
            if batch.final:  # the request ended: its INTERNAL outcome counts too
                stored = self.until_up(lambda: self.service.outcomes.get(job.id))
                if stored is not None:
                    self._observe(job.id, payload, stored, time.perf_counter() - batch.began, _latency(job))
            return
        self._observed(batch, replies)

    def _finish_apart(self, finish: Finished, replies: list[Outcome]) -> None:
        pipe = self.connection.pipeline(transaction=True)
        finish.add(pipe, replies)
        finish.done(pipe.execute(raise_on_error=False))

    def _refuse(self, job: Job, queue: Queue, reason: str) -> None:
        """A job that is not a sessionfork request: started, its ``INVALID_REQUEST`` outcome
        recorded, failed with no retry."""
        start = Started(self, [job], queue)
        start.ensure()
        self.execution = start.executions[0]
        log.warning("refused job %s: %s", job.id, reason)
        reply = self.until_up(lambda: self.service.outcomes.refuse(job.id, reason, self.service.reply_channel))
        self.until_up(lambda: self.fail(job, queue, f"refused: {reason}", retry=False))
        self._observe(job.id, "", reply, 0.0, _latency(job))

    def refuse_entry(self, entry: EntryRefused) -> None:
        """A queue entry RQ cannot load: an ``INVALID_REQUEST`` outcome under the entry's exact
        bytes (its id shown escaped), then the entry and its job hash are removed (nothing is
        left to leak, nothing without a TTL)."""
        reply = self.service.outcomes.refuse(entry.raw, entry.reason, self.service.reply_channel)
        log.warning("refused queue entry %s: %s", reply.request_id, entry.reason)
        # The outcome first: a worker dying in between leaves the entry, to be refused again.
        self.remove_entry(entry)
        self._observe(reply.request_id, "", reply, 0.0)

    def maintain(self) -> None:
        """One maintenance pass (``retention.run_pass``): dispose merged and abandoned branches that
        ended more than ``branch_ttl`` seconds ago (0: kept), then delete disposed sessions older
        than ``retention`` seconds (0: off).

        One batch of each per pass; several workers may run it at once (every step is idempotent)."""
        if self.retention <= 0 and self.branch_ttl <= 0:
            return
        done = retention.run_pass(self.service.registry, now_ms=now_ms(), retention_ms=self.retention * 1000,
                                  branch_ttl_ms=self.branch_ttl * 1000, persisted_first=self.delete_after_persist)
        if done.ended:
            log.info("branch TTL: disposed %d merged or abandoned branch(es)", len(done.ended))
        if done.swept:
            log.info("retention: deleted %d disposed session(s), %d bytes freed", len(done.swept),
                     sum(s.bytes for s in done.swept))

    def _observe(self, request_id: str, payload: str, reply: Outcome, seconds: float,
                 latency: float | None = None) -> None:
        if self.on_outcome is None:
            return
        try:
            self.on_outcome(request_id, payload, reply, seconds, latency)
        except Exception:  # metrics and logs must never stop the worker
            log.exception("outcome observer failed for %s", request_id)

    def job_ended(self, job: Job) -> None:
        # RQ ends jobs from several places (a failed run, the intermediate-queue cleanup); a job
        # that ends without a retry must still leave its request one outcome.
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
                reply = self.service.outcomes.refuse(job.id, str(refused), self.service.reply_channel)
                self._observe(job.id, "", reply, 0.0, _latency(job))
                return
            try:
                self.service.handle(payload, job.id, final_attempt=True)
            finally:
                stored = self.service.outcomes.get(job.id)
                if stored is not None:
                    self._observe(job.id, payload, stored, 0.0, _latency(job))
        except Exception:
            log.exception("could not finish the request of job %s", job.id)


class _Batch:
    """A batch (its jobs, with their payloads and prepared requests, in queue order), its RQ start
    and finish bookkeeping, and its flight once begun (``RequestWorker.run_batch``). ``start``: its
    start when already made (a request of a failed batch: ``Started.of``). ``final``: a batch of
    one job on its last attempt."""

    def __init__(self, worker: RequestWorker, items: list[tuple[Job, str, Prepared]], queue: Queue,
                 start: Started | None = None) -> None:
        self.items, self.queue = items, queue
        self.prepared = [prepared for _, _, prepared in items]
        batch_jobs = [job for job, _, _ in items]
        self.start = start or Started(worker, batch_jobs, queue)
        self.finish = Finished(worker, self.start)
        # One timeout for the batch: its shortest job's.
        self.shortest = min(batch_jobs, key=lambda job: job.timeout or worker.queue_class.DEFAULT_TIMEOUT)
        self.final = len(batch_jobs) == 1 and jobs.is_final_attempt(batch_jobs[0])
        self.flight: Flight | None = None
        self.began = time.perf_counter()


def _enqueued_ms(job: Job) -> int | None:
    """The job's enqueue time (RQ's ``enqueued_at``), epoch ms; ``None`` when RQ has none."""
    return None if job.enqueued_at is None else int(job.enqueued_at.timestamp() * 1000)


def _latency(job: Job) -> float | None:
    """Seconds from the job's enqueue (RQ's ``enqueued_at``) to now; ``None`` when RQ has none."""
    enqueued = job.enqueued_at
    return None if enqueued is None else max(0.0, now_ms() / 1000 - enqueued.timestamp())


def _payload(job: Job) -> str:
    """The request payload of a sessionfork job; ``_Refused`` for anything else.

    Any shape of the job's ``data`` is refused here, never raised: a name that is not text,
    arguments that are not a list, keyword arguments that are not a mapping.
    """
    try:
        name, args, kwargs = job.func_name, job.args, job.kwargs
    except Exception as exc:
        raise _Refused(f"job payload is not a JSON sessionfork job ({type(exc).__name__})") from None
    if name != jobs.JOB_FUNCTION:
        raise _Refused(f"job names {name!r}; this worker runs only {jobs.JOB_FUNCTION}")
    if kwargs or not isinstance(args, list | tuple) or len(args) != 1 or not isinstance(args[0], str):
        raise _Refused(f"{jobs.JOB_FUNCTION} takes exactly one argument: the request JSON as a string")
    return args[0]

