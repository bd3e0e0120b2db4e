"""A ``sessionfork`` process that SIGKILLs itself at one step of the first batch its worker runs.

Usage: python batch_killer.py STEP SESSIONFORK-ARGS...  (e.g. ``taken --redis-url URL worker``)

STEP is where the kill lands: ``taken`` (the take moved the batch to RQ's intermediate queue, nothing
started), ``started`` (the batch's first round trip ran: RQ's start of every job, every claim),
``created`` (the batch's child steps, which stream one fork at a time, cut after the first
request's: its children exist, the others not), ``recording`` (every child exists,
the records' transaction is not sent), ``overlapped`` (a take of several batches: the second batch
begun, its claims and child steps sent, before the first batch's end: no record sent).
"""

import os
import signal
import sys
from typing import Any

from sessionfork.core.call_stream import CallStream
from sessionfork.worker import service
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.rq_seam.worker import SeamWorker


def die(*_: Any, **__: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


step = sys.argv[1]
if step == "taken":
    take = SeamWorker.take

    def taken(self: SeamWorker, count: int) -> Any:
        found = take(self, count)
        if found.entries:
            die()
        return found

    SeamWorker.take = taken  # type: ignore[method-assign]
elif step == "started":
    run = service.Trip.run

    def ran(self: Any) -> Any:
        out = run(self)
        if self._parts:  # the batch's first trip carries RQ's start
            die()
        return out

    service.Trip.run = ran  # type: ignore[method-assign]
elif step == "created":
    send = CallStream.send

    def created(self: CallStream, calls: Any) -> Any:
        # The batch's child steps stream, one send per fork: the first fork's children made (its
        # replies read), the kill lands before the second fork's calls are sent.
        if self._calls:
            self.replies((0, len(self._calls)))
            die()
        return send(self, calls)

    CallStream.send = created  # type: ignore[method-assign]
elif step == "recording":
    Outcomes.record_many = die  # type: ignore[method-assign]
elif step == "overlapped":
    begin, end = service.RequestService.begin, service.RequestService.end
    begun: list[Any] = []

    def began(self: Any, batch: Any, **kwargs: Any) -> Any:
        flight = begin(self, batch, **kwargs)
        begun.append(flight)
        return flight

    def ended(self: Any, flight: Any, **kwargs: Any) -> Any:
        if len(begun) > 1:  # the next batch has begun: the kill lands before this one's end
            flight.sent.collect()  # its child steps' replies read first: every child it makes exists
            die()
        return end(self, flight, **kwargs)

    service.RequestService.begin = began  # type: ignore[method-assign]
    service.RequestService.end = ended  # type: ignore[method-assign]
else:
    raise SystemExit(f"unknown step {step!r}")

from sessionfork.cli import main  # noqa: E402 - after the patches

sys.argv = ["sessionfork", *sys.argv[2:]]
main()
