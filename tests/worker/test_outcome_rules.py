"""The outcome store's two rules, on a real server, in-process: a request id has one outcome
(stored once, streamed once, announced once, whoever records it later), and a request id claimed by
one request is an ``IDEMPOTENCY_CONFLICT`` for any other, also while the first is unfinished."""

from __future__ import annotations

import time

import pytest
from redis import Redis

from sessionfork.core import keys, lua, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, NewEvent
from sessionfork.protocol.requests import Limits
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.service import RequestService

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

TURN = [NewEvent("turn/start", {}), NewEvent("turn/end", {})]


def test_a_request_id_keeps_its_first_outcome_announced_once(redis: Redis) -> None:
    outcomes = Outcomes(redis, ttl=60, stream_maxlen=100)
    first = ForkFailure(request_id="once", code="SESSION_NOT_FOUND", message="first")
    later = ForkFailure(request_id="once", code="INTERNAL", message="later")
    pubsub = redis.pubsub()
    try:
        pubsub.subscribe("sf:replies")
        deadline = time.monotonic() + 10
        confirmed = None
        while confirmed is None or confirmed["type"] != "subscribe":  # the server confirmed it
            assert time.monotonic() < deadline, "subscription not confirmed"
            confirmed = pubsub.get_message(timeout=0.2)
        assert outcomes.record(first, "sf:replies") == first
        assert outcomes.record(later, "sf:replies") == first  # the first stored stands
        published = []
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:  # collect whatever arrives; one message is expected
            message = pubsub.get_message(timeout=0.2)
            if message is not None:
                published.append(message["data"])
            elif published:
                break
    finally:
        pubsub.close()
    assert outcomes.get("once") == first
    assert redis.xlen(keys.OUTCOME_STREAM) == 1
    assert published == [wire.encode(first)]


def test_a_request_id_claimed_by_an_unfinished_request_is_a_conflict_for_another(redis: Redis) -> None:
    registry = Registry(redis)
    registry.append(registry.create("src"), TURN)
    outcomes = Outcomes(redis, ttl=60, stream_maxlen=100)
    svc = RequestService(registry, outcomes, reply_channel="sf:replies", limits=Limits(max_fanout=16))
    # A first attempt of request A claimed "dup" (planning child "a-child") and died before its outcome.
    first = wire.decode_request('{"source":"src","sessionId":"a-child"}')
    lua.run(redis, [outcomes.claim_op([("dup", first, ["a-child"])])])

    reply = svc.handle('{"source":"src","sessionId":"b-child"}', "dup", final_attempt=True)

    assert not reply.ok and reply.code == "IDEMPOTENCY_CONFLICT", reply
    assert not registry.exists("b-child") and not registry.exists("a-child")
    assert outcomes.get("dup") is None  # the id's one outcome will be A's
