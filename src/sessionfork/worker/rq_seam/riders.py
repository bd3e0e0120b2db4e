"""A worker's RQ bookkeeping of one job as riders of the request's own round trips (no RQ import:
the commands are ``SeamWorker.start`` and ``SeamWorker.finish``'s, added to the pipelines that
``worker.trip.Trip`` and ``worker.outcomes.Outcomes.record`` send)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .worker import SeamWorker


class JobStart:
    """A worker's start bookkeeping of ``job`` as a ``trip.Part``: sent at the head of the request's
    claim, in its round trip, when that trip goes on the worker's own connection (``redis``)."""

    def __init__(self, worker: SeamWorker, job: Any, queue: Any) -> None:
        self.worker, self.job, self.queue = worker, job, queue
        self.redis = worker.connection
        self.sent = False  # the server answered every start command

    def add(self, pipe: Any) -> None:
        self.worker.start(self.job, self.queue, pipe)

    def done(self, replies: list[Any]) -> None:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        self.sent = True

    def ensure(self) -> None:
        """Send the start bookkeeping now unless it rode a trip already (a request refused before
        its claim, a run that failed before it)."""
        if not self.sent:
            self.worker.until_up(lambda: self.worker.start(self.job, self.queue))
            self.sent = True


class JobFinish:
    """A worker's success bookkeeping of ``job`` as the tail of the outcome's record transaction
    (``Outcomes.record``'s ``then``), when it goes on the worker's own connection (``redis``)."""

    def __init__(self, worker: SeamWorker, job: Any) -> None:
        self.worker, self.job = worker, job
        self.redis = worker.connection
        self.sent = False  # the server ran it (with the record)
        self.result: Any = None  # the reply it stored as RQ's result

    def add(self, pipe: Any, result: Any) -> None:
        self.result = result
        self.worker.finish(self.job, result, pipe)

    def done(self, replies: list[Any]) -> None:
        for reply in replies:
            if isinstance(reply, Exception):
                self.worker.finish_failed()
                raise reply
        self.worker.finished(replies)
        self.sent = True

    def failed(self) -> None:
        self.worker.finish_failed()
