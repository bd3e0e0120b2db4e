"""A batch of requests, from their bytes to their outcomes, top to bottom (a lone request is a
batch of one, through the same stages):

1. ``prepare``, per request, through its operation's entry (``protocol.operations``): decode and
   validate at the edge (its ``edge``: ``requests.parse``, ``merge_requests.parse``; each id
   checked once), the request's one spec, its edits and summary checked against ``append``'s
   rules (its ``check``: ``forks.check``, ``merges.check``; the event size limit is the
   registry's); a request refused there carries its failure;
2. ``begin``: one ``Trip``, the worker's RQ start bookkeeping of the batch, the claims of the
   request ids (one script call) and, on a shared single server, the core's source steps
   (``forks.source_ops``, read by ``forks.plan``); the new fan-outs' snapshots kept; every
   fork's child step sent (``forks.send_many``), so that a worker may begin its next batch;
3. ``end``: the child steps' replies read, every merge and select step (``merges.run_many``),
   then the outcomes recorded, streamed and published (``outcomes``: the one module that writes
   outcomes), with the worker's RQ success bookkeeping in the same transaction.

``RequestService.run`` is ``begin`` then ``end``; ``handle`` runs one request as a batch of one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from ..core import errors, forks, merges, rules, wire
from ..core.config import Settings
from ..core.errors import ErrorCode, ForkError
from ..core.factories import new_session_id, now_ms
from ..core.forks import Sent
from ..core.outages import is_outage
from ..core.registry import Registry
from ..core.snapshots import ForkPlan, Snapshot
from ..core.specs import ForkSpec, MergeSpec, SelectSpec
from ..core.wire import Outcome
from ..protocol import operations, requests, tracing
from ..protocol.operations import Operation, Spec
from ..protocol.outcomes import conflict
from ..protocol.requests import DEFAULT_LIMITS, Limits
from ..protocol.shards import shard_of
from .outcomes import Finish, Outcomes, Pending
from .trip import Part, Trip


class Start(Part, Protocol):
    """A worker's RQ start bookkeeping of a batch's jobs, on the queue connection ``redis``;
    ``sent`` once the server has answered it (``rq_seam.riders.Started``)."""

    redis: Any
    sent: bool


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request of a batch (``RequestService.prepare``): parsed and checked, with its one spec, or
    refused at the edge (``refusal``: its failure, recorded with the batch's outcomes under
    ``digest``). ``alone``: it runs as a batch of its own (a select, a fork of more children
    than a batch's budget, any request while forks wait for replicas)."""

    payload: str | bytes
    request_id: str
    op: Operation
    channel: str
    request: wire.AnyRequest | None = None
    spec: Spec | None = None
    refusal: Outcome | None = None
    digest: str = ""
    enqueued_ms: int | None = None
    alone: bool = False

    @property
    def children(self) -> int:
        """The children it creates, as a batch counts them (``batch_children``): a fork's; else 0."""
        return len(_children(self.spec))


class Flight:
    """A batch begun (``RequestService.begin``): its requests claimed, its child steps sent;
    ``RequestService.end`` ends it."""

    def __init__(self, batch: Sequence[Prepared], start: Start | None, began: float, final_attempt: bool) -> None:
        self.batch, self.start, self.began, self.final_attempt = batch, start, began, final_attempt
        self.spans = contextlib.ExitStack()
        self.runs: list[tracing.RequestSpan] = []  # each request's span
        self.pending: list[Pending | None] = []  # each request's outcome once known (None: still to run)
        self.merging: list[MergeSpec | SelectSpec] = []  # the merges and selects to run
        self.sent: Sent | None = None  # the child steps, once sent

    def close(self, error: BaseException) -> None:
        """Give up on the batch after ``error`` (its caller runs the requests again): the child
        steps' replies are never read, and the requests' spans end with ``error``."""
        if self.sent is not None:
            self.sent.close()
        self.spans.__exit__(type(error), error, error.__traceback__)


class RequestService:
    """Runs requests against a registry, in batches (a lone request is a batch of one), recording
    outcomes in ``outcomes``."""

    def __init__(self, registry: Registry, outcomes: Outcomes, *, reply_channel: str, limits: Limits = DEFAULT_LIMITS,
                 new_id: Callable[[], str] = new_session_id,
                 monotonic: Callable[[], float] = time.perf_counter, shard: tuple[int, int] | None = None,
                 batch_children: int = Settings().batch_children) -> None:
        """``shard``: ``(index, count)`` of the sharded queue's shard whose server ``outcomes`` is on;
        a request whose id lives on another shard is refused (``WRONG_SHARD``). ``None``: one queue
        server, every request id is its own. ``batch_children``: the most children the forks of
        one batch create (a fork of more runs alone: ``Prepared.alone``)."""
        self.registry = registry
        self.batch_children = batch_children
        self.outcomes = outcomes
        self.reply_channel = reply_channel
        self.limits = limits
        self.shard = shard
        self._new_id = new_id
        self._monotonic = monotonic

    @classmethod
    def from_settings(cls, registry: Registry, queue_redis: Any, settings: Settings) -> RequestService:
        """A service on ``registry`` whose outcomes live on ``queue_redis``, limits from ``settings``."""
        outcomes = Outcomes(queue_redis, ttl=settings.outcome_ttl, stream_maxlen=settings.outcome_stream_maxlen,
                            compact=settings.compact_records)
        limits = Limits(max_request_bytes=settings.max_request_bytes, max_fanout=settings.max_fanout,
                        max_id_length=settings.max_id_length, max_write_bytes=settings.max_request_write_bytes)
        urls = settings.queue_urls or ()
        shard = (settings.shard, len(urls)) if len(urls) > 1 and settings.shard is not None else None
        return cls(registry, outcomes, reply_channel=settings.reply_channel, limits=limits, shard=shard,
                   batch_children=settings.batch_children)

    def handle(self, payload: str | bytes, job_id: str, *, final_attempt: bool = True,
               enqueued_ms: int | None = None) -> Outcome:
        """Run one request to its outcome and return the outcome (the first one, on a replay): a
        batch of one (``prepare``, then ``run``).

        ``enqueued_ms`` (epoch ms) lets the outcome stream record the enqueue-to-outcome latency.
        With OpenTelemetry installed, the run is one span continuing the request's ``traceparent``
        (a retried request: one span per run; the last run's ends with its outcome, ``INTERNAL`` too).
        """
        return self.run([self.prepare(payload, job_id, enqueued_ms=enqueued_ms)], final_attempt=final_attempt)[0]

    def prepare(self, payload: str | bytes, job_id: str, *, enqueued_ms: int | None = None) -> Prepared:
        """``payload`` parsed and checked for a batch: its one spec, or its refusal (a request of
        another shard, bad input), before any Redis call."""
        op = operations.of("fork")
        try:
            self._check_shard(job_id)  # first: the right shard validates it, and nothing is read here
            op = operations.of(wire.request_op(payload))
            request, spec = op.edge(payload, job_id, self.limits, self._new_id)
            op.check(self.registry, spec)  # the event size limit is the registry's
        except ForkError as exc:
            raw = payload.encode() if isinstance(payload, str) else payload
            return Prepared(payload, job_id, op, requests.reply_channel_of(raw, self.reply_channel, self.limits),
                            refusal=op.failed(job_id, exc.code.value, exc.message),
                            digest=requests.invalid_digest(raw), enqueued_ms=enqueued_ms)
        alone = (bool(self.registry.forks.state.wait_replicas) or op.alone
                 or len(_children(spec)) > self.batch_children)
        return Prepared(payload, job_id, op, requests.reply_channel(request, self.reply_channel), request, spec,
                        enqueued_ms=enqueued_ms, alone=alone)

    def run(self, batch: Sequence[Prepared], *, start: Start | None = None, finish: Finish | None = None,
            final_attempt: bool = False) -> list[Outcome]:
        """Run a batch of prepared requests to their outcomes (each the first one, on a replay):
        ``begin`` then ``end``, with nothing between them."""
        return self.end(self.begin(batch, start=start, final_attempt=final_attempt), finish=finish)

    def begin(self, batch: Sequence[Prepared], *, start: Start | None = None, final_attempt: bool = False) -> Flight:
        """A batch begun: the claims (one script call) and source steps (one per source) in one
        round trip (with ``start``, the worker's RQ start bookkeeping of the batch, at the head),
        the new fan-outs' snapshots kept (one transaction), then every fork's child step sent
        (``forks.send_many``: on one server they stream, and the server creates the children
        while the caller goes on). The caller then ends it (``end``). Its guarantees:

        * a request whose id lives on another shard of a sharded queue ends as ``WRONG_SHARD``, and
          bad input (size, JSON, schema, ids, limits, edits) as ``INVALID_REQUEST``, before any work;
        * a request id runs at most once: a replay returns the first outcome and creates nothing;
        * each outcome is stored before it is announced, and announced exactly once;
        * an unexpected exception is raised (nothing left open) for the caller to run the requests
          again (each a batch of one); ``final_attempt`` (no attempt left): each request's
          ``INTERNAL`` outcome is recorded first. An outage is raised as it is, never recorded.
        """
        flight = Flight(batch, start, self._monotonic(), final_attempt)
        try:
            flight.runs = [flight.spans.enter_context(tracing.request_span(item.payload, item.request_id,
                                                                           current=False)) for item in batch]
            flight.sent = forks.send_many(self.registry, self._claim(flight))
            return flight
        except BaseException as exc:
            self._give_up(flight, exc)
            raise

    def end(self, flight: Flight, *, finish: Finish | None = None) -> list[Outcome]:
        """The batch ``flight`` (``begin``'s) to its outcomes: its child steps' replies read
        (``Sent.collect``), each step of every merge and select in one round trip
        (``merges.run_many``: records, children's steps, parents' steps, marks), then the records
        and announcements (one script call) in one transaction (with ``finish``, its RQ success
        bookkeeping, once the batch's ``start`` was sent). An unexpected exception is raised, as
        ``begin``'s."""
        try:
            replies = self._end(flight, finish)
        except BaseException as exc:
            self._give_up(flight, exc)
            raise
        for span, reply in zip(flight.runs, replies, strict=True):
            span.finish(reply)
        flight.spans.close()
        return replies

    def _give_up(self, flight: Flight, error: BaseException) -> None:
        """Give up on the batch ``flight`` after ``error``: the child steps' replies are never read,
        and the requests' spans end with ``error``; on the final attempt (an error that is not an
        outage), each request's ``INTERNAL`` outcome is recorded first (a refused one's refusal)."""
        try:
            if flight.final_attempt and isinstance(error, Exception) and not is_outage(error):
                for item, span in zip(flight.batch, flight.runs, strict=False):
                    failure = item.refusal or self._internal(item, error)
                    span.finish(failure)
                    self.outcomes.record(failure, item.channel, digest=item.digest)
        finally:
            flight.close(error)

    def _internal(self, item: Prepared, error: Exception) -> Outcome:
        """The ``INTERNAL`` outcome of ``item`` after ``error``, saying what its fork created."""
        message = f"internal error: {type(error).__name__}: {error}"
        fork = _forked(item.spec)
        made = [] if fork is None else self._created_by(fork)
        if made:  # no hidden partial state: say what exists
            message += f"; created before the failure: {', '.join(made)}"
        return item.op.failed(item.request_id, ErrorCode.INTERNAL.value, message)

    def _claim(self, flight: Flight) -> list[tuple[ForkSpec, ForkPlan, Snapshot | None]]:
        """``begin`` up to its child steps: each request's outcome when its refusal or claim settles
        it (``flight.pending``; ``None``: a request still to run), the merges and selects to run
        (``flight.merging``); returns the forks to create. A fork's spec is for the children its
        claim planned (an earlier attempt's, on a retry); a merge or select plans nothing (its
        retry is recognised by the parent's merges index)."""
        batch, trip = flight.batch, self._trip(flight.start)
        claimed = [item for item in batch if item.spec is not None]
        claims = trip.ops([self.outcomes.claim_op([(item.request_id, item.request, _children(item.spec))
                                                   for item in claimed if item.request is not None])]) \
            if claimed else None
        # Source steps only read: a batch of forks of one source reads it once (``Trip.reads``).
        looks = [None if look is None else trip.reads(look)
                 for look in (self._source_ops(_forked(item.spec), trip) for item in claimed)]
        groups = trip.run()
        raws = iter(zip(groups[claims][0], looks, strict=True) if claims is not None else ())
        pending, merging = flight.pending, flight.merging
        planned: list[tuple[ForkSpec, ForkPlan, Snapshot | None]] = []
        for item in batch:
            if item.spec is None:
                assert item.refusal is not None
                pending.append(Pending(item.refusal, item.channel, digest=item.digest))
                continue
            raw, look = next(raws)
            claim = self.outcomes.claim_of(raw, item.request_id)
            if claim.outcome is not None:
                pending.append(Pending(claim.outcome, store=False))
            elif claim.state == "CONFLICT":
                # Never announced: the request id's one outcome is the first request's. Its
                # submitter learns of the conflict from the stored digest (``Client.wait``) or
                # from the any-language enqueue script (-1); this job just ends with it.
                pending.append(Pending(conflict(item.request_id, item.op.name), store=False))
            elif (fork := _forked(item.spec)) is None:  # a merge's or select's steps run with the batch's others
                merging.append(cast("MergeSpec | SelectSpec", item.spec))
                pending.append(None)
            else:  # a fork: its children (those its claim planned) created by the batch's child steps
                new = claim.state == "NEW"
                spec = fork if new else fork.with_children(claim.children)
                plan = forks.plan(self.registry, spec, groups[look] if new and look is not None else None)
                planned.append((spec, plan, claim.snapshot))
                pending.append(None)
        # The new fan-outs keep their snapshots before any child exists, all in one round trip: a
        # retry after a crash creates the rest from the same one.
        keeping = [(i, spec.request_id, snap) for i, (spec, plan, kept) in enumerate(planned)
                   if (snap := _to_keep(spec, plan, kept)) is not None]
        kept_now = self.outcomes.keep_snapshots([(request_id, snap) for _, request_id, snap in keeping])
        for (i, _, _), snapshot in zip(keeping, kept_now, strict=True):
            planned[i] = (planned[i][0], planned[i][1], snapshot)
        return planned

    def _end(self, flight: Flight, finish: Finish | None) -> list[Outcome]:
        batch, pending = flight.batch, flight.pending
        assert flight.sent is not None  # begin sent them
        # Every child step of the batch read; each merge step of its merges in one round trip.
        made = iter(flight.sent.collect())
        merged = iter(merges.run_many(self.registry, flight.merging) if flight.merging else ())
        for i, (item, done) in enumerate(zip(batch, pending, strict=True)):
            if done is None:
                result = next(made) if item.op.creates else next(merged)
                try:
                    if isinstance(result, ForkError):
                        raise result
                    reply = item.op.reply(item.request, item.request_id, result)
                except ForkError as exc:
                    reply = item.op.failed(item.request_id, exc.code.value, exc.message)
                pending[i] = Pending(reply, item.channel, int((self._monotonic() - flight.began) * 1e6),
                                     _latency_us(item.enqueued_ms))
        then = finish if flight.start is not None and flight.start.sent else None  # RQ's order: start, then finish
        return self.outcomes.record_many([p for p in pending if p is not None], then)

    def _check_shard(self, request_id: str) -> None:
        """``WRONG_SHARD`` when ``request_id`` lives on another shard than the one served (a producer
        routing with another shard list, or none): forked here, the same id sent to its own shard
        would fork again, since the two shards' records of it never meet. The refusal is recorded
        under the id on this server only, so it never holds back the request on its own shard."""
        if self.shard is None:
            return
        served, count = self.shard
        owner = shard_of(request_id, count)
        if owner != served:
            raise errors.wrong_shard(rules.shown_id(request_id), owner, served, count)

    def _trip(self, start: Start | None) -> Trip:
        """A round trip on the queue server, with ``start`` at its head when it goes there and was
        not sent yet."""
        trip = Trip(self.outcomes.redis)
        if start is not None and not start.sent and start.redis is trip.redis:
            trip.add(start)
        return trip

    def _source_ops(self, spec: ForkSpec | None, trip: Trip) -> list[Any] | None:
        """The core's source step of the fork ``spec`` to ride ``trip`` (``forks.source_ops``), or
        ``None`` (none to ride: not a fork, or a registry elsewhere)."""
        return None if spec is None else forks.source_ops(self.registry, spec, trip.redis)

    def _created_by(self, spec: ForkSpec) -> list[str]:
        """Children that the spec's request created (best effort: a failing Redis answers none)."""
        try:
            return forks.created_by(self.registry, spec.with_children(self.outcomes.planned(spec.request_id)))
        except Exception:
            return []


def _to_keep(spec: ForkSpec, plan: ForkPlan, kept: Snapshot | None) -> Snapshot | None:
    """The snapshot a claimed fork keeps before its children (a new fan-out's: its plan's, when no
    earlier attempt kept one), else ``None``."""
    return plan.snapshot if kept is None and len(spec.child_ids) > 1 else None


def _forked(spec: Spec | None) -> ForkSpec | None:
    """The spec of a request that creates children (its operation's ``creates``: a fork's), else
    ``None``: the one place the service tells a fork from the others."""
    return spec if isinstance(spec, ForkSpec) else None


def _children(spec: Spec | None) -> Sequence[str]:
    """The children a request's claim plans: a fork's; a merge or select plans none."""
    fork = _forked(spec)
    return () if fork is None else fork.child_ids


def _latency_us(enqueued_ms: int | None) -> int:
    """Microseconds from a request's enqueue (epoch ms) to now; 0 when unknown."""
    return 0 if enqueued_ms is None else max(0, (now_ms() - enqueued_ms) * 1000)
