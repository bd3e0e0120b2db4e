"""One fork request, from its bytes to its one outcome, top to bottom:

1. ``requests.parse``: decode and validate at the edge (each id checked once); the request's one
   ``ForkSpec`` (``requests.spec_of``), its edits and summary checked against ``append``'s rules
   (``forks.check``: the event size limit is the registry's);
2. one ``Trip``: the worker's RQ start bookkeeping, the claim of the request id and, on a shared
   single server, the core's source step (``forks.source_ops``, read by ``forks.plan``);
3. create the children (``forks.create``; a fan-out first keeps its snapshot for retries; a
   batch's, every request's, streamed: ``forks.send_many`` in ``begin_many``, their replies read
   in ``end_many``, so that a worker may begin its next batch in between);
4. record, stream and publish the outcome (``outcomes``: the one module that writes outcomes),
   with the worker's RQ success bookkeeping in the same transaction.

``ForkService.handle`` is what a worker runs per job. Its guarantees:

* a request whose id lives on another shard of a sharded queue ends as ``WRONG_SHARD``, and bad
  input (size, JSON, schema, ids, limits, edits) as ``INVALID_REQUEST``, before any work;
* a request id forks at most once: a replay returns the first outcome and creates nothing;
* the outcome is stored before it is announced, and announced exactly once;
* an unexpected exception is re-raised for RQ to retry; on the last attempt it is first recorded
  as ``INTERNAL``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

from msgspec import UNSET

from ..core import errors, forks, merges, rules, wire
from ..core.config import Settings
from ..core.errors import ErrorCode, ForkError
from ..core.factories import new_session_id, now_ms
from ..core.forks import FanOut, Sent
from ..core.outages import is_outage
from ..core.registry import Registry
from ..core.snapshots import ForkPlan, Snapshot
from ..core.specs import ForkSpec, MergeSpec, SelectSpec
from ..core.wire import ChildError, ForkFailure, ForkRequest, ForkResult, MergeRequest, Outcome, Reply
from ..protocol import merge_requests, requests, tracing
from ..protocol.requests import DEFAULT_LIMITS, Limits
from ..protocol.shards import shard_of
from .outcomes import Claim, Outcomes, Pending, Then, ThenMany
from .trip import Part, Trip

Spec = ForkSpec | MergeSpec | SelectSpec
"""The one spec of a request: a fork's, a merge's or a select's."""


class Start(Part, Protocol):
    """A worker's RQ start bookkeeping of a job, or of a batch's jobs, on the queue connection
    ``redis``; ``sent`` once the server has answered it (``rq_seam.riders.JobStart``, ``JobsStart``)."""

    redis: Any
    sent: bool


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request a batch runs (``ForkService.prepare``): a valid fork (within the batch's children)
    or a valid merge, parsed and checked, with its one spec."""

    payload: str | bytes
    request: ForkRequest | MergeRequest
    spec: ForkSpec | MergeSpec
    channel: str
    enqueued_ms: int | None = None

    @property
    def children(self) -> int:
        """The children it creates, as a batch counts them (``batch_children``): a fork's; a merge 0."""
        return len(self.spec.child_ids) if isinstance(self.spec, ForkSpec) else 0


class Flight:
    """A batch begun (``ForkService.begin_many``): its requests claimed, its child steps sent;
    ``ForkService.end_many`` ends it, or ``close`` gives up on it."""

    def __init__(self, batch: Sequence[Prepared], start: Start | None, began: float,
                 spans: contextlib.ExitStack, runs: list[tracing.RequestSpan]) -> None:
        self.batch, self.start, self.began, self.spans, self.runs = batch, start, began, spans, runs
        self.pending: list[Pending | None] = []  # each request's outcome once known (None: still to run)
        self.merging: list[MergeSpec] = []  # the merges to run
        self.sent: Sent | None = None  # the child steps, once sent

    def close(self, error: BaseException | None = None) -> None:
        """Give up on the batch (its caller runs the requests again): the child steps' replies are
        never read, and the requests' spans end (with ``error``, when one ended the batch)."""
        if self.sent is not None:
            self.sent.close()
        if error is None:
            self.spans.close()
        else:
            self.spans.__exit__(type(error), error, error.__traceback__)


class ForkService:
    """Runs fork requests against a registry, recording outcomes in ``outcomes``."""

    def __init__(self, registry: Registry, outcomes: Outcomes, *, reply_channel: str, limits: Limits = DEFAULT_LIMITS,
                 new_id: Callable[[], str] = new_session_id,
                 monotonic: Callable[[], float] = time.perf_counter, shard: tuple[int, int] | None = None,
                 batch_children: int = Settings().batch_children) -> None:
        """``shard``: ``(index, count)`` of the sharded queue's shard whose server ``outcomes`` is on;
        a request whose id lives on another shard is refused (``WRONG_SHARD``). ``None``: one queue
        server, every request id is its own. ``batch_children``: the most children the forks of
        one batch create (a worker's budget for ``prepare``)."""
        self.registry = registry
        self.batch_children = batch_children
        self.outcomes = outcomes
        self.reply_channel = reply_channel
        self.limits = limits
        self.shard = shard
        self._new_id = new_id
        self._monotonic = monotonic

    @classmethod
    def from_settings(cls, registry: Registry, queue_redis: Any, settings: Settings) -> ForkService:
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
               enqueued_ms: int | None = None, start: Start | None = None, finish: Then | None = None) -> Outcome:
        """Run one request to its outcome and return the outcome (the first one, on a replay).

        ``enqueued_ms`` (epoch ms) lets the outcome stream record the enqueue-to-outcome latency.
        With OpenTelemetry installed, the run is one span continuing the request's ``traceparent``
        (a retried request: one span per run; the last run's ends with its outcome, ``INTERNAL`` too).
        ``start``: the worker's RQ start bookkeeping, sent ahead of the claim in its round trip when
        that trip goes on ``start.redis`` and it was not sent yet (``start.sent`` says whether it was).
        ``finish``: its success bookkeeping, sent in the transaction that records the outcome of a
        run that claimed the request, once ``start`` was sent (``finish.sent`` says whether it was).
        """
        with tracing.request_span(payload, job_id) as span:
            try:
                reply = self._handle(payload, job_id, final_attempt=final_attempt, enqueued_ms=enqueued_ms,
                                     start=start, finish=finish)
            except Exception as exc:
                if final_attempt and not is_outage(exc):  # recorded INTERNAL: the run's span says so too
                    span.finish(ForkFailure(request_id=job_id, code=ErrorCode.INTERNAL.value, message=""))
                raise  # an outage runs again (another span); anything else ends INTERNAL
            span.finish(reply)
            return reply

    def prepare(self, payload: str | bytes, job_id: str, *, enqueued_ms: int | None = None,
                most_children: int = 1) -> Prepared | None:
        """``payload`` parsed and checked for a batch (``handle_many``), when it is a valid fork of
        at most ``most_children`` children (the batch's ``batch_children``) or a valid merge on
        this shard; ``None`` for anything else (a larger fan-out, a select: it
        touches many sessions; a refused request), and for every request when forks wait for
        replicas (each its own WAIT, retried alone when too few acknowledge): ``handle`` runs it on
        its own, so that none of them holds a batch. A fork too large is told from its size before
        any of its ids is generated."""
        if self.registry.forks.state.wait_replicas:
            return None
        try:
            self._check_shard(job_id)
            op = wire.request_op(payload)
            if op not in ("fork", "merge"):
                return None
            request, spec = self._parse(op, payload, job_id, most_children=most_children)
        except ForkError:
            return None
        if spec is None:
            return None
        if isinstance(spec, ForkSpec) and isinstance(request, ForkRequest):
            pass
        elif not isinstance(spec, MergeSpec) or not isinstance(request, MergeRequest):
            return None
        return Prepared(payload, request, spec, requests.reply_channel(request, self.reply_channel), enqueued_ms)

    def handle_many(self, batch: Sequence[Prepared], *, start: Start | None = None,
                    finish: ThenMany | None = None) -> list[Outcome]:
        """Run a batch of prepared requests to their outcomes (each the first one, on a replay):
        ``begin_many`` then ``end_many``, with nothing between them."""
        return self.end_many(self.begin_many(batch, start=start), finish=finish)

    def begin_many(self, batch: Sequence[Prepared], *, start: Start | None = None) -> Flight:
        """A batch begun: the claims (one script call) and source steps (one per source) in one
        round trip (with ``start``, the worker's RQ start bookkeeping of the batch, at the head),
        the new fan-outs' snapshots kept (one transaction), then every fork's child step sent
        (``forks.send_many``: on one server they stream, and the server creates the children
        while the caller goes on). The caller then ends it (``end_many``), or closes it
        (``Flight.close``) when it gives up. Each request's guarantees are ``handle``'s; an
        unexpected exception is raised (nothing left open) for the caller to run the requests on
        their own (``handle``: each records ``INTERNAL`` on its last attempt)."""
        spans = contextlib.ExitStack()
        try:
            flight = Flight(batch, start, self._monotonic(), spans, [
                spans.enter_context(tracing.request_span(item.payload, item.spec.request_id, current=False))
                for item in batch])
            flight.sent = forks.send_many(self.registry, self._claim_many(flight))
            return flight
        except BaseException as exc:
            spans.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def end_many(self, flight: Flight, *, finish: ThenMany | None = None) -> list[Outcome]:
        """The batch ``flight`` (``begin_many``'s) to its outcomes: its child steps' replies read
        (``Sent.collect``), each step of every merge in one round trip (``merges.run_many``:
        records, children's steps, parents' steps, marks), then the records and announcements (one
        script call) in one transaction (with ``finish``, its RQ success bookkeeping, once the
        batch's ``start`` was sent). An unexpected exception is raised, as ``begin_many``'s; the
        flight is closed either way."""
        try:
            replies = self._end_many(flight, finish)
        except BaseException as exc:
            flight.close(exc)
            raise
        for span, reply in zip(flight.runs, replies, strict=True):
            span.finish(reply)
        flight.spans.close()
        return replies

    def _claim_many(self, flight: Flight) -> list[tuple[ForkSpec, ForkPlan, Snapshot | None]]:
        """``begin_many`` up to its child steps: each request's outcome when its claim settles it
        (``flight.pending``; ``None``: a fork or a merge still to run), the merges to run
        (``flight.merging``); returns the forks to create."""
        batch, trip = flight.batch, self._trip(flight.start)
        claims = trip.ops([self.outcomes.claim_op([(item.spec.request_id, item.request, _children(item.spec))
                                                   for item in batch])])
        # Source steps only read: a batch of forks of one source reads it once (``Trip.reads``).
        looks = [None if look is None else trip.reads(look)
                 for look in (self._source_ops(item.spec, trip) if isinstance(item.spec, ForkSpec) else None
                              for item in batch)]
        groups = trip.run()
        pending, merging = flight.pending, flight.merging
        planned: list[tuple[ForkSpec, ForkPlan, Snapshot | None]] = []
        for item, raw, look in zip(batch, groups[claims][0], looks, strict=True):
            request_id, op = item.spec.request_id, _op(item.spec)
            claim = self.outcomes.claim_of(raw, request_id)
            if claim.outcome is not None:
                pending.append(Pending(claim.outcome, store=False))
            elif claim.state == "CONFLICT":  # never announced: as ``handle``
                pending.append(Pending(_conflict(op, request_id), store=False))
            elif isinstance(item.spec, MergeSpec):
                merging.append(item.spec)
                pending.append(None)
            else:
                new = claim.state == "NEW"
                spec = item.spec if new else item.spec.with_children(claim.children)
                planned.append((spec, *self._plan(spec, claim, groups[look] if new and look is not None else None,
                                                  keep=False)))
                pending.append(None)
        # The new fan-outs keep their snapshots before any child exists, all in one round trip.
        keeping = [(i, spec.request_id, snap) for i, (spec, plan, kept) in enumerate(planned)
                   if (snap := _to_keep(spec, plan, kept)) is not None]
        kept_now = self.outcomes.keep_snapshots([(request_id, snap) for _, request_id, snap in keeping])
        for (i, _, _), snapshot in zip(keeping, kept_now, strict=True):
            planned[i] = (planned[i][0], planned[i][1], snapshot)
        return planned

    def _end_many(self, flight: Flight, finish: ThenMany | None) -> list[Outcome]:
        batch, pending = flight.batch, flight.pending
        assert flight.sent is not None  # begin_many sent them
        # Every child step of the batch read; each merge step of its merges in one round trip.
        made = iter(flight.sent.collect())
        merged = iter(merges.run_many(self.registry, flight.merging))
        for i, (item, done) in enumerate(zip(batch, pending, strict=True)):
            if done is None:
                try:
                    if isinstance(item.spec, MergeSpec):
                        result = next(merged)
                        if isinstance(result, ForkError):
                            raise result
                        reply: Outcome = merge_requests.reply_of(item.spec.request_id, result, False)
                    else:
                        assert isinstance(item.request, ForkRequest)
                        reply = _fork_reply(item.request, item.spec.request_id, next(made))
                except ForkError as exc:
                    reply = wire.failure(_op(item.spec), item.spec.request_id, exc.code.value, exc.message)
                pending[i] = Pending(reply, item.channel, int((self._monotonic() - flight.began) * 1e6),
                                     _latency_us(item.enqueued_ms))
        then = finish if flight.start is not None and flight.start.sent else None  # RQ's order: start, then finish
        return self.outcomes.record_many([p for p in pending if p is not None], then)

    def _handle(self, payload: str | bytes, job_id: str, *, final_attempt: bool,
                enqueued_ms: int | None, start: Start | None, finish: Then | None) -> Outcome:
        started = self._monotonic()
        op = "fork"
        try:
            self._check_shard(job_id)  # first: the right shard validates it, and nothing is read here
            op = wire.request_op(payload)
            request, spec = self._parse(op, payload, job_id)
        except ForkError as exc:
            raw = payload.encode() if isinstance(payload, str) else payload
            failure = wire.failure(op, job_id, exc.code.value, exc.message)
            return self.outcomes.record(failure, requests.reply_channel_of(raw, self.reply_channel, self.limits),
                                        digest=requests.invalid_digest(raw))
        channel = requests.reply_channel(request, self.reply_channel)
        try:
            claim, spec, looked = self._claim(request, spec, start)
            if claim.outcome is not None:
                return claim.outcome
            if claim.state == "CONFLICT":
                # Never announced: the request id's one outcome is the first request's. Its
                # submitter learns of the conflict from the stored digest (``Client.wait``) or
                # from the any-language enqueue script (-1); this job just ends with it.
                return _conflict(op, job_id)
            if isinstance(spec, ForkSpec):
                assert isinstance(request, ForkRequest)
                reply: Outcome = self._fork(request, spec, claim, looked)
            else:
                reply = merge_requests.reply_of(job_id, merges.run(self.registry, spec), isinstance(spec, SelectSpec))
        except ForkError as exc:
            reply = wire.failure(op, job_id, exc.code.value, exc.message)
        except Exception as exc:
            if is_outage(exc):
                raise  # Redis is briefly away or busy: the worker backs off and runs the request again
            if final_attempt:
                message = f"internal error: {type(exc).__name__}: {exc}"
                made = self._created_by(spec) if isinstance(spec, ForkSpec) else []
                if made:  # no hidden partial state: say what exists
                    message += f"; created before the failure: {', '.join(made)}"
                internal = wire.failure(op, job_id, ErrorCode.INTERNAL.value, message)
                self.outcomes.record(internal, channel)
            raise
        elapsed = int((self._monotonic() - started) * 1e6)
        then = finish if start is not None and start.sent else None  # RQ's order: start, then finish
        return self.outcomes.record(reply, channel, duration_us=elapsed, latency_us=_latency_us(enqueued_ms),
                                    then=then)

    @overload
    def _parse(self, op: str, payload: str | bytes, job_id: str) -> tuple[wire.AnyRequest, Spec]: ...

    @overload
    def _parse(self, op: str, payload: str | bytes, job_id: str,
               most_children: int) -> tuple[wire.AnyRequest, Spec | None]: ...

    def _parse(self, op: str, payload: str | bytes, job_id: str,
               most_children: int | None = None) -> tuple[wire.AnyRequest, Spec | None]:
        """The request decoded and validated (``INVALID_REQUEST``), and its one spec, checked
        against ``append``'s rules (the event size limit is the registry's): a fork's
        (``requests``, ``forks.check``), or a merge's or select's (``merge_requests``, ``merges.check``).
        ``most_children``: no spec (``None``) for a fork of more children, which runs alone
        (``prepare``): its ids are not generated nor its spec checked twice."""
        if op == "fork":
            fork, edits = requests.parse_edited(payload, job_id, self.limits)
            if most_children is not None and requests.planned_children(fork) > most_children:
                return fork, None
            spec = requests.spec_of(fork, job_id, self._children_of(fork), edits)
            forks.check(self.registry, spec)
            return fork, spec
        merge = merge_requests.parse(payload, job_id, self.limits, op)
        merge_spec = merge_requests.spec_of(merge, job_id, self.limits)
        merges.check(self.registry, merge_spec)
        return merge, merge_spec

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

    def _claim(self, request: wire.AnyRequest, spec: Spec,
               start: Start | None) -> tuple[Claim, Spec, list[Any] | None]:
        """Claim the request id in one ``Trip`` on the queue server: the worker's ``start`` at its
        head (when it goes there and was not sent yet), the claim, then, for a fork, the core's
        source step when the registry is on that very server (``forks.source_ops``). Returns the
        claim, the spec (a fork's for the children the claim planned: an earlier attempt's, on a
        retry) and the source step's replies, dropped (``None``) when the request is not new: its
        children were planned by an earlier attempt, and the step runs again for them. A merge or
        select plans nothing: its retry is recognised by the parent's merges index."""
        trip = self._trip(start)
        fork = spec if isinstance(spec, ForkSpec) else None
        trip.ops([self.outcomes.claim_op([(spec.request_id, request, () if fork is None else fork.child_ids)])])
        look = None if fork is None else self._source_ops(fork, trip)
        if look is not None:
            trip.ops(look)
        ((raw,),), *looked = trip.run()
        claim = self.outcomes.claim_of(raw, spec.request_id)
        if fork is None:
            return claim, spec, None
        if claim.state != "NEW":
            return claim, fork.with_children(claim.children), None
        return claim, fork, looked[0] if looked else None

    def _trip(self, start: Start | None) -> Trip:
        """A round trip on the queue server, with ``start`` at its head when it goes there and was
        not sent yet."""
        trip = Trip(self.outcomes.redis)
        if start is not None and not start.sent and start.redis is trip.redis:
            trip.add(start)
        return trip

    def _source_ops(self, spec: ForkSpec, trip: Trip) -> list[Any] | None:
        """The core's source step of ``spec`` to ride ``trip`` (``forks.source_ops``), or ``None``."""
        return forks.source_ops(self.registry, spec, trip.redis)

    def _fork(self, request: ForkRequest, spec: ForkSpec, claim: Claim, looked: list[Any] | None) -> Reply:
        """The children of a claimed request, from one snapshot, each with its edits: the reply
        that reports them. The source step's plan comes from ``looked`` (its replies in the
        claim's trip) or runs now; a fan-out keeps its snapshot before any child exists, so that
        a retry after a crash creates the rest from the same one."""
        plan, snapshot = self._plan(spec, claim, looked)
        return _fork_reply(request, spec.request_id, forks.create(self.registry, spec, plan, snapshot))

    def _plan(self, spec: ForkSpec, claim: Claim, looked: list[Any] | None,
              keep: bool = True) -> tuple[ForkPlan, Snapshot | None]:
        """A claimed fork's plan (its source step's, from ``looked``, or run now) and the snapshot its
        children are made from: the claim's (a retried fan-out's, kept by its first attempt) or,
        for a new fan-out, the plan's, kept before any child exists (a retry after a crash
        creates the rest from the same one); ``None``: the plan's own. ``keep=False``: the claim's
        snapshot, the plan's left for the caller to keep (``_to_keep``; a batch keeps its
        fan-outs' all at once)."""
        plan = forks.plan(self.registry, spec, looked)
        snapshot = claim.snapshot
        if keep and (snap := _to_keep(spec, plan, snapshot)) is not None:
            snapshot = self.outcomes.keep_snapshot(spec.request_id, snap)
        return plan, snapshot

    def _children_of(self, request: ForkRequest) -> list[str]:
        """The child ids a new request plans: the caller's, or generated ones."""
        if request.session_ids is not UNSET:
            return list(request.session_ids)
        if request.count is not UNSET:
            return [self._new_id() for _ in range(request.count)]
        if request.variants is not UNSET:
            return [self._new_id() if v.session_id is UNSET else v.session_id for v in request.variants]
        return [self._new_id() if request.session_id is UNSET else request.session_id]

    def _created_by(self, spec: ForkSpec) -> list[str]:
        """Children that the spec's request created (best effort: a failing Redis answers none)."""
        try:
            return forks.created_by(self.registry, spec.with_children(self.outcomes.planned(spec.request_id)))
        except Exception:
            return []


def _fork_reply(request: ForkRequest, request_id: str, result: FanOut | ForkError) -> Reply:
    """The reply of a fork request that ``result`` answers (its error raised): a one-child fork's
    child (its one failure raised), a fan-out's children and failures."""
    if isinstance(result, ForkError):
        raise result
    if not request.fans_out:
        if result.failed:
            raise result.failed[0][1]
        return ForkResult(request_id=request_id, session=result.created[0])
    return ForkResult(
        request_id=request_id, ok=not result.failed, sessions=result.created,
        failed=[ChildError(session_id=cid, code=e.code.value, message=e.message)
                for cid, e in result.failed] or UNSET,
    )


def _to_keep(spec: ForkSpec, plan: ForkPlan, kept: Snapshot | None) -> Snapshot | None:
    """The snapshot a claimed fork keeps before its children (a new fan-out's: its plan's, when no
    earlier attempt kept one), else ``None``."""
    return plan.snapshot if kept is None and len(spec.child_ids) > 1 else None


def _children(spec: ForkSpec | MergeSpec) -> Sequence[str]:
    """The children a request's claim plans: a fork's; a merge plans none."""
    return spec.child_ids if isinstance(spec, ForkSpec) else ()


def _op(spec: ForkSpec | MergeSpec) -> str:
    """The request's op, as its failures name it."""
    return "fork" if isinstance(spec, ForkSpec) else "merge"


def _conflict(op: str, request_id: str) -> Outcome:
    """The failure of a request whose id was claimed by a different request: never announced (the
    request id's one outcome is the first request's)."""
    return wire.failure(op, request_id, ErrorCode.IDEMPOTENCY_CONFLICT.value,
                        f'request id "{request_id}" was already used for a different request')


def _latency_us(enqueued_ms: int | None) -> int:
    """Microseconds from a request's enqueue (epoch ms) to now; 0 when unknown."""
    return 0 if enqueued_ms is None else max(0, (now_ms() - enqueued_ms) * 1000)
