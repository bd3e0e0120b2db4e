"""A worker's RQ bookkeeping of one job as riders of the request's own round trips (no RQ import:
the commands are ``SeamWorker.start`` and ``SeamWorker.finish``'s, added to the pipelines that
``worker.trip.Trip`` and ``worker.outcomes.Outcomes.record`` send), and of a batch of jobs as one
script call each (``JobsStart``, ``JobsFinish``: the ``ledger``'s), with RQ's own methods' commands
for the worker's state, added to the round trips the batch makes anyway."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .worker import SeamWorker


def _check(replies: list[Any]) -> list[Any]:
    """``replies``, raising the first error among them."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return list(replies)


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
        _check(replies)
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

    def __init__(self, worker: SeamWorker, job: Any, queue: Any) -> None:
        self.worker, self.job, self.queue = worker, job, queue
        self.redis = worker.connection
        self.sent = False  # the server ran it (with the record)
        self.result: Any = None  # the reply it stored as RQ's result

    def add(self, pipe: Any, result: Any) -> None:
        self.result = result
        self.worker.finish(self.job, self.queue, result, pipe)

    def done(self, replies: list[Any]) -> None:
        for reply in replies:
            if isinstance(reply, Exception):
                self.worker.finish_failed()
                raise reply
        self.worker.finished(replies)
        self.sent = True

    def failed(self) -> None:
        self.worker.finish_failed()


class JobsStart:
    """A worker's start bookkeeping of a batch of ``jobs`` as a ``trip.Part``: one script call
    (``ledger``: atomic) and the worker's own state, at the head of the batch's claims, on the
    worker's own connection (``redis``)."""

    def __init__(self, worker: SeamWorker, jobs: Sequence[Any], queue: Any) -> None:
        self.worker, self.jobs, self.queue = worker, jobs, queue
        self.redis = worker.connection
        self.sent = False  # the server ran every start command
        self.executions: list[Any] = []  # RQ's execution of each job, in job order

    def add(self, pipe: Any) -> None:
        # Sent again (its trip failed: it may have run): the same executions again.
        self.executions = self.worker.start_many(self.jobs, self.queue, pipe, again=self.executions)

    def done(self, replies: list[Any]) -> None:
        _check(replies)
        self.sent = True

    def ensure(self) -> None:
        """Send the start bookkeeping now unless it rode a trip already."""
        if not self.sent:
            def send() -> None:
                pipe = self.redis.pipeline(transaction=False)
                self.add(pipe)
                self.done(pipe.execute(raise_on_error=False))
            self.worker.until_up(send)


class JobsFinish:
    """A worker's success bookkeeping of a batch of jobs (started by ``start``) as the tail of the
    outcomes' record transaction (``Outcomes.record_many``'s ``then``)."""

    def __init__(self, worker: SeamWorker, start: JobsStart) -> None:
        self.worker, self.start = worker, start
        self.redis = worker.connection
        self.last = True  # False: a later batch of the worker's has started (``SeamWorker.finish_many``)
        self.sent = False  # the server ran it (with the records)
        self.results: list[Any] = []  # the replies it stored as RQ's results, in job order
        self._worked = 0.0

    def add(self, pipe: Any, results: Sequence[Any]) -> None:
        """Add the commands to ``pipe``, a transaction's pipeline."""
        self.results = list(results)
        self._worked = self.worker.finish_many(self.start.jobs, self.start.queue, self.results, self.start.executions,
                                               pipe, self.last)

    def done(self, replies: list[Any]) -> None:
        self.worker.finished_many(_check(replies), len(self.start.jobs), self._worked, self.last)
        self.sent = True

    def failed(self) -> None:
        """The transaction failed: nothing of it ran (the executions stay, for a retry)."""
