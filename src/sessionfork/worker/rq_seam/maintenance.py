"""The maintenance half of the RQ seam's worker (``MaintainedWorker``): RQ's maintenance pass kept
running through outages and bad entries, with jobs stranded by a killed worker requeued, and the
back-off every Redis step of the loop runs under (``until_up``). Every RQ name used here is listed,
with its reason, in the package docstring (``sessionfork.worker.rq_seam``)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import RedisError
from rq import SimpleWorker, worker_registration
from rq.exceptions import StopRequested
from rq.registry import clean_registries
from rq.utils import now

from ...core.outages import is_outage
from .entries import EntryRefused, is_text

T = TypeVar("T")
log = logging.getLogger("sessionfork.worker")


class MaintainedWorker(SimpleWorker):
    """RQ's in-process worker with its maintenance pass and outage back-off hardened; subclasses
    implement ``refuse_entry`` (a queue entry RQ cannot load) and may add to ``maintain``."""

    abandoned_after: int = 30
    unreachable_at_stop: bool = False  # the loop stopped on a step that found Redis unreachable

    def refuse_entry(self, entry: EntryRefused) -> None:
        raise NotImplementedError

    def maintain(self) -> None:
        """The subclass's own part of each maintenance pass (after RQ's); nothing by default."""

    def teardown(self) -> None:
        # Unregistering is best effort: a stop must not fail because Redis is away or slow
        # (the registration expires on its own). Away when the loop stopped: not even tried
        # (each command would wait out its connect time-out, per sentinel behind Sentinel).
        if self.unreachable_at_stop:
            log.warning("worker %s stopped with Redis unreachable: not unregistered (its registration "
                        "expires on its own)", self.name)
            if self.pubsub_thread is not None:  # RQ's command listener: a daemon thread, told to end
                self.pubsub_thread.stop()
            return
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
                    self.unreachable_at_stop = True
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
