"""A worker's RQ bookkeeping of a batch of jobs (a lone job: a batch of one) as riders of the
batch's own round trips (no RQ import): its start (``Started``) at the head of the batch's first
round trip (``worker.trip.Trip``), its success (``Finished``) in the records' transaction
(``worker.outcomes.Outcomes.record_many``); each one script call (the ``ledger``'s), with RQ's own
methods' commands for the worker's state (``SeamWorker.start``, ``finish``)."""

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


class Started:
    """A worker's start bookkeeping of a batch of ``jobs`` as a ``trip.Part``: one script call
    (``ledger``: atomic) and the worker's own state, at the head of the batch's claims, on the
    worker's own connection (``redis``)."""

    def __init__(self, worker: SeamWorker, jobs: Sequence[Any], queue: Any) -> None:
        self.worker, self.jobs, self.queue = worker, jobs, queue
        self.redis = worker.connection
        self.sent = False  # the server ran every start command
        self.executions: list[Any] = []  # RQ's execution of each job, in job order

    def of(self, i: int) -> Started:
        """The start of the batch's ``i``-th job alone, sent when this one was (its execution)."""
        one = Started(self.worker, [self.jobs[i]], self.queue)
        if self.sent:
            one.sent, one.executions = True, [self.executions[i]]
        return one

    def add(self, pipe: Any) -> None:
        # Sent again (its trip failed: it may have run): the same executions again.
        self.executions = self.worker.start(self.jobs, self.queue, pipe, again=self.executions)

    def done(self, replies: list[Any]) -> None:
        _check(replies)
        self.sent = True

    def ensure(self) -> None:
        """Send the start bookkeeping now unless it rode a trip already (a batch whose first round
        trip went on another client, or failed before it)."""
        if not self.sent:
            def send() -> None:
                pipe = self.redis.pipeline(transaction=False)
                self.add(pipe)
                self.done(pipe.execute(raise_on_error=False))
            self.worker.until_up(send)


class Finished:
    """A worker's success bookkeeping of a batch of jobs (started by ``start``) as the tail of the
    outcomes' record transaction (``Outcomes.record_many``'s ``finish``)."""

    def __init__(self, worker: SeamWorker, start: Started) -> None:
        self.worker, self.start = worker, start
        self.redis = worker.connection
        self.last = True  # False: a later batch of the worker's has started (``SeamWorker.finish``)
        self.sent = False  # the server ran it (with the records)
        self.results: list[Any] = []  # the replies it stored as RQ's results, in job order
        self._worked = 0.0

    def add(self, pipe: Any, results: Sequence[Any]) -> None:
        """Add the commands to ``pipe``, a transaction's pipeline."""
        self.results = list(results)
        self._worked = self.worker.finish(self.start.jobs, self.start.queue, self.results, self.start.executions,
                                               pipe, self.last)

    def done(self, replies: list[Any]) -> None:
        self.worker.finished(_check(replies), len(self.start.jobs), self._worked, self.last)
        self.sent = True

    def failed(self) -> None:
        """The transaction failed: nothing of it ran (the executions stay, for a retry)."""
