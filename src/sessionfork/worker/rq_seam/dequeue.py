"""The dequeue of the RQ seam's worker (``DequeuingWorker``): RQ's dequeue loop made safe for a fork
worker (a stop request never strands a job, an entry RQ cannot load is refused), with the dequeue
of the entry the last job's finish saw at the queue's front in one round trip. Every RQ name used
here is listed, with its reason, in the package docstring (``sessionfork.worker.rq_seam``)."""

from __future__ import annotations

import functools
import time
from typing import Any

from rq.exceptions import DequeueTimeout, StopRequested
from rq.worker import WorkerStatus

from ...core.connections import stop_retrying
from .entries import DequeuedJob, entry_of
from .maintenance import MaintainedWorker

_IDLE_POLL = 1  # seconds an idle worker blocks waiting for a job before it looks at its stop flag


class DequeuingWorker(MaintainedWorker):
    """``MaintainedWorker`` with RQ's dequeue loop hardened; see the module docstring."""

    _holding: bool = False  # a job may be out of the queue and not finished yet
    stop_signalled: bool = False  # SIGTERM/SIGINT asked this worker to stop
    _front: bytes | None = None  # the queue's front entry when the last job finished (one queue only)

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stop_signalled = True
        # A warm stop whatever the servers' state: no command of a stopping worker rides out an
        # outage (with every sentinel gone, one command's retries took minutes), the one retrying
        # now included. A command that fails ends its step with StopRequested (``until_up``).
        for client in self.redis_clients():
            stop_retrying(client)
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def redis_clients(self) -> list[Any]:
        """The Redis clients this worker's steps use (their retries end at a stop request)."""
        return [self.connection]

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
                self.until_up(functools.partial(self.refuse_entry, entry_of(exc)))
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
                                            job_class=DequeuedJob, serializer=self.serializer,
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
        queue = self.queue_class.from_queue_key(queue.key, connection=self.connection, job_class=DequeuedJob,
                                                serializer=self.serializer,
                                                death_penalty_class=self.death_penalty_class)
        try:
            if moved == front:
                return DequeuedJob.loaded(job_id, data, self.connection, self.serializer), queue
            return DequeuedJob.fetch(job_id, connection=self.connection, serializer=self.serializer), queue
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
