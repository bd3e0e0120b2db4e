"""``ResilientWorker``: RQ's in-process worker loop, hardened for short idempotent jobs.

What it changes in RQ's ``SimpleWorker`` loop (the job itself is the subclass's business):

* a stop request never strands a job: from the moment a job may leave the queue until it is done,
  SIGTERM only sets a flag; idle waits are short (1 s), so an idle worker still stops at once;
* a queue entry RQ cannot load (an id it refuses, a malformed job hash) is handed to
  ``_refuse_entry`` instead of stopping the worker (RQ quits on it, and so would every restart);
* Redis being unreachable pauses the worker (back-off, then the same step again) instead of
  failing the job in hand or quitting;
* a job stranded in RQ's intermediate queue by a worker killed between dequeue and start goes
  back to the queue after ``abandoned_after`` seconds (RQ waits minutes, then fails it);
* heartbeats at most once a second, and no redundant state writes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rq import SimpleWorker, worker_registration
from rq.exceptions import DequeueTimeout, StopRequested
from rq.registry import clean_registries
from rq.utils import now
from rq.worker import WorkerStatus

from . import lua
from .connections import TRANSIENT

T = TypeVar("T")
log = logging.getLogger("sessionfork.worker")
DOWN = TRANSIENT
_HEARTBEAT_EVERY = 1.0
_IDLE_POLL = 1  # seconds an idle worker blocks waiting for a job before it looks at its stop flag


class ResilientWorker(SimpleWorker):
    """See the module docstring. Subclasses implement ``execute_job`` and ``_refuse_entry``."""

    abandoned_after: int = 30
    _holding: bool = False  # a job may be out of the queue and not finished yet
    stop_signalled: bool = False  # SIGTERM/SIGINT asked this worker to stop

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stop_signalled = True
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def _refuse_entry(self, job_id: str, exc: Exception) -> None:
        raise NotImplementedError

    @functools.cached_property
    def _requeue(self) -> Any:
        return lua.register(self.connection, "requeue.lua")

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
        last = self.last_heartbeat
        if last is not None and timeout is None and (now() - last).total_seconds() < _HEARTBEAT_EVERY:
            return
        self._until_up(lambda: super(ResilientWorker, self).heartbeat(timeout))


    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is None and state == self._state:
            return  # already recorded (the job's last pipeline sets IDLE)
        super().set_state(state, pipeline)


    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        """RQ's dequeue loop, made safe for a fork worker.

        * From the moment a job may leave the queue until it is done, a stop request only sets a
          flag (RQ raises at once while the worker is idle, which strands a just-dequeued job in
          the intermediate queue); blocking waits are short, so an idle worker still stops within
          a second.
        * A queue entry RQ cannot load (an id it refuses, a malformed job hash) is refused with
          an ``INVALID_REQUEST`` outcome instead of stopping the worker.
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
            try:
                result = self._until_up(functools.partial(
                    self.queue_class.dequeue_any, self._ordered_queues, wait, connection=self.connection,
                    job_class=self.job_class, serializer=self.serializer,
                    death_penalty_class=self.death_penalty_class))
            except DequeueTimeout:
                self._holding = False
                if max_idle_time is not None and time.monotonic() - idle_since > max_idle_time:
                    return None
                continue
            except Exception as exc:
                self._holding = False
                job_id = getattr(exc, "job_id", None)
                if job_id is None:
                    raise
                self._until_up(functools.partial(self._refuse_entry, str(job_id), exc))
                continue
            if result is None:
                self._holding = False
                return None
            job, queue = result
            job.redis_server_version = self.get_redis_server_version()  # type: ignore[no-untyped-call]
            log.info("%s: %s", queue.name, job.id)
            return result


    def _shutdown(self) -> None:
        if self._holding:
            self._stop_requested = True  # finish the job in hand, take no new one
            return
        super()._shutdown()  # type: ignore[no-untyped-call]


    def run_maintenance_tasks(self) -> None:
        # RQ's loop calls this too, outside any guard: an outage here must pause, not quit.
        self._until_up(self._maintain)

    def _maintain(self) -> None:
        try:
            self._requeue_stranded()
            super().run_maintenance_tasks()  # type: ignore[no-untyped-call]
        except DOWN:
            raise
        except Exception:
            # A malformed entry in an RQ registry must not stop the worker; the next pass retries.
            log.exception("maintenance pass failed")
            self.last_cleaned_at = now()  # type: ignore[assignment]


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
                    except DOWN:
                        log.warning("could not release the maintenance lock of %s; it expires", queue.name)
        self.last_cleaned_at = now()  # type: ignore[assignment]


    def _until_up(self, step: Callable[[], T]) -> T:
        """Run ``step``; while Redis is unreachable, back off and run it again (steps are idempotent)."""
        delay = 0.1
        while True:
            try:
                return step()
            except DOWN as exc:
                if self._stop_requested:
                    raise
                log.warning("Redis unreachable (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)  # back-off, not synchronisation
                delay = min(delay * 2, 5.0)
