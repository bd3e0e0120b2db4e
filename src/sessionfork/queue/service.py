"""One fork request, from its bytes to its one outcome: decode, validate, claim, fork, record.

``ForkService.handle`` is what a worker runs per job. Its guarantees:

* bad input (size, JSON, schema, ids, limits) ends as ``INVALID_REQUEST`` before any work;
* a request id forks at most once: a replay returns the first outcome and creates nothing;
* the outcome is stored before it is announced, and announced exactly once;
* an unexpected exception is re-raised for RQ to retry; on the last attempt it is first recorded
  as ``INTERNAL``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType
from redis.exceptions import NoScriptError

from ..core import errors, rules, wire
from ..core.config import Settings
from ..core.connections import TRANSIENT
from ..core.errors import ErrorCode, ForkError
from ..core.factories import new_session_id, now_ms
from ..core.forks import FanOut, fork_many
from ..core.registry import Registry
from ..core.snapshots import ForkPlan
from ..core.wire import ChildError, ForkFailure, ForkRequest, ForkResult, LiveHandle, Reply
from .outcomes import Claim, Outcomes

MAX_CHANNEL_LENGTH = 256


class ForkService:
    """Runs fork requests against a registry, recording outcomes in ``outcomes``."""

    def __init__(self, registry: Registry, outcomes: Outcomes, *, reply_channel: str,
                 max_request_bytes: int, max_fanout: int, max_id_length: int = 128,
                 new_id: Callable[[], str] = new_session_id,
                 monotonic: Callable[[], float] = time.perf_counter) -> None:
        self.registry = registry
        self.outcomes = outcomes
        self.reply_channel = reply_channel
        self.max_request_bytes = max_request_bytes
        self.max_fanout = max_fanout
        self.max_id_length = max_id_length
        self._new_id = new_id
        self._monotonic = monotonic

    @classmethod
    def from_settings(cls, registry: Registry, queue_redis: Any, settings: Settings) -> ForkService:
        """A service on ``registry`` whose outcomes live on ``queue_redis``, limits from ``settings``."""
        outcomes = Outcomes(queue_redis, ttl=settings.outcome_ttl, stream_maxlen=settings.outcome_stream_maxlen)
        return cls(registry, outcomes, reply_channel=settings.reply_channel,
                   max_request_bytes=settings.max_request_bytes, max_fanout=settings.max_fanout,
                   max_id_length=settings.max_id_length)

    def parse(self, payload: str | bytes, job_id: str) -> ForkRequest:
        """Decode and validate a request; ``INVALID_REQUEST`` naming the field otherwise."""
        raw = payload.encode() if isinstance(payload, str) else payload
        if len(raw) > self.max_request_bytes:
            raise errors.invalid(f"request is {len(raw)} bytes, over the limit of {self.max_request_bytes}")
        request = wire.decode_request(raw)
        rules.check_request_id(job_id, "requestId (the RQ job id)")
        if request.request_id is not UNSET and request.request_id != job_id:
            raise errors.invalid(f"requestId {request.request_id!r} does not match the job id {job_id!r}")
        rules.check_id(request.source_id, "source")
        if isinstance(request.source, LiveHandle) and not request.source.instance:
            raise errors.invalid("invalid source: a live handle needs a non-empty instance")
        if request.session_id is not UNSET:
            rules.check_id(request.session_id, "sessionId")
        chosen = [f for f in ("sessionId", "sessionIds", "count")
                  if getattr(request, _FIELDS[f]) is not UNSET]
        if len(chosen) > 1:
            raise errors.invalid(f"invalid request: {' and '.join(chosen)} are exclusive")
        if request.count is not UNSET and not 1 <= request.count <= self.max_fanout:
            raise errors.invalid(f"invalid count {request.count}: expected 1 to {self.max_fanout}")
        if request.session_ids is not UNSET:
            ids = request.session_ids
            if not 1 <= len(ids) <= self.max_fanout:
                raise errors.invalid(f"invalid sessionIds: expected 1 to {self.max_fanout} ids, got {len(ids)}")
            for i, cid in enumerate(ids):
                rules.check_id(cid, f"sessionIds[{i}]")
            if len(set(ids)) != len(ids):
                raise errors.invalid("invalid sessionIds: ids must be distinct")
        named = [("requestId", job_id), ("source", request.source_id)]
        named += [("sessionId", request.session_id)] if request.session_id is not UNSET else []
        named += [(f"sessionIds[{i}]", c) for i, c in enumerate(request.session_ids or ())]
        for field, value in named:
            if len(value) > self.max_id_length:
                limit = self.max_id_length
                raise errors.invalid(f"invalid {field}: {len(value)} characters, over the limit of {limit}")
        if request.reply_to is not UNSET and not _valid_channel(request.reply_to):
            raise errors.invalid(f"invalid replyTo: expected 1-{MAX_CHANNEL_LENGTH} printable ASCII characters")
        return request

    def handle(self, payload: str | bytes, job_id: str, *, final_attempt: bool = True,
               enqueued_ms: int | None = None) -> Reply:
        """Run one request to its outcome and return the outcome (the first one, on a replay).

        ``enqueued_ms`` (epoch ms) lets the outcome stream record the enqueue-to-outcome latency.
        """
        started = self._monotonic()
        try:
            request = self.parse(payload, job_id)
        except ForkError as exc:
            raw = payload.encode() if isinstance(payload, str) else payload
            failure = ForkFailure(request_id=job_id, code=exc.code.value, message=exc.message)
            return self.outcomes.record(failure, self._reply_channel_of(raw),
                                        digest="invalid:" + hashlib.sha256(raw).hexdigest())
        channel = self.reply_channel if request.reply_to is UNSET else request.reply_to
        try:
            claim, plan = self._claim(request, job_id)
            if claim.outcome is not None:
                return claim.outcome
            if claim.state == "CONFLICT":
                # Never announced: the request id's one outcome is the first request's. Its
                # submitter learns of the conflict from the stored digest (``Client.wait``) or
                # from the any-language enqueue script (-1); this job just ends with it.
                return ForkFailure(
                    request_id=job_id, code=ErrorCode.IDEMPOTENCY_CONFLICT.value,
                    message=f'request id "{job_id}" was already used for a different request')
            reply = self._execute(request, job_id, claim, plan)
        except ForkError as exc:
            reply = ForkFailure(request_id=job_id, code=exc.code.value, message=exc.message)
        except TRANSIENT:
            raise  # Redis is briefly away: the worker backs off and runs the request again
        except Exception as exc:
            if final_attempt:
                message = f"internal error: {type(exc).__name__}: {exc}"
                made = self._created_by(request, job_id)
                if made:  # no hidden partial state: say what exists
                    message += f"; created before the failure: {', '.join(made)}"
                internal = ForkFailure(request_id=job_id, code=ErrorCode.INTERNAL.value, message=message)
                self.outcomes.record(internal, channel)
            raise
        elapsed = int((self._monotonic() - started) * 1e6)
        latency = 0 if enqueued_ms is None else max(0, (now_ms() - enqueued_ms) * 1000)
        return self.outcomes.record(reply, channel, duration_us=elapsed, latency_us=latency)

    def _created_by(self, request: ForkRequest, request_id: str) -> list[str]:
        """Children that ``request_id`` created (best effort: a failing Redis answers none)."""
        try:
            planned = self.outcomes.planned(request_id)
            plan = self.registry.prepare_fork(request.source, planned, request_id=request_id)
        except Exception:
            return []
        return sorted(plan.replayed)

    def _reply_channel_of(self, raw: bytes) -> str:
        """The ``replyTo`` of a request refused as invalid, when it can be read and is valid."""
        if len(raw) <= self.max_request_bytes:
            try:
                reply_to = _reply_to_only.decode(raw).reply_to
            except (msgspec.DecodeError, RecursionError):
                reply_to = UNSET
            if reply_to is not UNSET and _valid_channel(reply_to):
                return reply_to
        return self.reply_channel

    def _plan(self, request: ForkRequest) -> list[str]:
        if request.session_ids is not UNSET:
            return list(request.session_ids)
        if request.count is not UNSET:
            return [self._new_id() for _ in range(request.count)]
        return [self._new_id() if request.session_id is UNSET else request.session_id]

    def _claim(self, request: ForkRequest, request_id: str) -> tuple[Claim, ForkPlan | None]:
        """Claim the request id; on a shared single server, run the source step in the same trip.

        The source step only reads, so its result is simply dropped when the claim says the
        request is not new (its children were planned by an earlier attempt).
        """
        planned = self._plan(request)
        redis = self.outcomes.redis
        if redis is not self.registry.redis or self.registry.is_cluster:
            return self.outcomes.claim(request_id, request, planned), None
        pipe = redis.pipeline(transaction=False)
        self.outcomes.queue_claim(pipe, request_id, request, planned)
        parse = self.registry.queue_prepare(pipe, request.source, planned, request_id=request_id)
        results = pipe.execute(raise_on_error=False)
        if any(isinstance(r, NoScriptError) for r in results):
            self.outcomes.load_scripts()
            self.registry.load_scripts()
            return self.outcomes.claim(request_id, request, planned), None
        for r in results:
            if isinstance(r, Exception):
                raise r
        claim = self.outcomes.parse_claim(results[0])
        return claim, parse(results) if claim.state == "NEW" else None

    def _execute(self, request: ForkRequest, request_id: str, claim: Claim, plan: ForkPlan | None) -> Reply:
        result: FanOut = fork_many(
            self.registry, request.source, claim.children, request_id=request_id,
            stored=claim.snapshot, plan=plan,
            remember=(lambda snap: self.outcomes.remember_snapshot(request_id, snap))
            if len(claim.children) > 1 else None,
        )
        if not request.fans_out:
            if result.failed:
                raise result.failed[0][1]
            return ForkResult(request_id=request_id, session=result.created[0])
        return ForkResult(
            request_id=request_id, ok=not result.failed, sessions=result.created,
            failed=[ChildError(session_id=cid, code=e.code.value, message=e.message)
                    for cid, e in result.failed] or UNSET,
        )


_FIELDS = {"sessionId": "session_id", "sessionIds": "session_ids", "count": "count"}


class _ReplyTo(msgspec.Struct, rename="camel"):
    reply_to: str | UnsetType = UNSET


_reply_to_only = msgspec.json.Decoder(_ReplyTo)


def _valid_channel(name: str) -> bool:
    return 0 < len(name) <= MAX_CHANNEL_LENGTH and name.isascii() and name.isprintable()
