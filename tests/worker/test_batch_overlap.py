"""A take's batches overlap: the next batch begins (its claims, source steps and child steps sent)
before the batch ahead of it ends (its child steps' replies read, its records and RQ's finish), on
a real server, RQ 3 and RQ 2.12; a batch with merges ends before the next begins; a batch whose
beginning fails runs each request on its own, the batch ahead of it ended first."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import family, outcome_entries, queue_of
from redis import Redis
from rq.registry import FinishedJobRegistry, StartedJobRegistry
from rq.version import VERSION

from sessionfork import Registry
from sessionfork.clients.client import Client
from sessionfork.core import keys
from sessionfork.core.config import Settings
from sessionfork.core.wire import ForkResult, MergeResult, Outcome
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.service import Flight, RequestService

pytestmark = pytest.mark.rq

TURN_EVENTS = 2  # the source's one turn: turn/start, turn/end
RQ_MAJOR = int(VERSION.split(".")[0])


class Watched(RequestService):
    """Records each ``prepare``, ``begin`` and ``end`` (``("prepare" | "begin" | "end", request
    ids)``), and runs ``at_end`` at each ``end``'s entry and ``after_end`` once it returned."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[str, list[str]]] = []
        self.at_end: list[dict[str, Any]] = []
        self.after_end: list[dict[str, Any]] = []
        self.look: Any = lambda: {}
        self.fail_begin: set[str] = set()  # the request ids whose batch's next begin raises (once)

    def prepare(self, payload: str | bytes, job_id: str, **kwargs: Any) -> Any:
        self.steps.append(("prepare", [job_id]))
        return super().prepare(payload, job_id, **kwargs)

    def begin(self, batch: Any, **kwargs: Any) -> Flight:
        ids = [item.request_id for item in batch]
        self.steps.append(("begin", ids))
        if self.fail_begin & set(ids):
            self.fail_begin -= set(ids)
            raise RuntimeError("a bug in a batch's beginning")
        return super().begin(batch, **kwargs)

    def end(self, flight: Flight, **kwargs: Any) -> list[Outcome]:
        self.steps.append(("end", [item.request_id for item in flight.batch]))
        self.at_end.append(self.look())
        out = super().end(flight, **kwargs)
        self.after_end.append(self.look())
        return out


def _run(redis: Redis, registry: Registry, batch_children: int) -> tuple[Watched, RequestWorker]:
    service = Watched(registry, Outcomes(redis, ttl=600, stream_maxlen=10_000), reply_channel="sf:replies",
                      limits=Limits(max_fanout=64), batch_children=batch_children)
    worker = RequestWorker([jobs.make_queue(redis, Settings())], service=service, connection=redis,
                        abandoned_after=30, batch=16)
    return service, worker


def _fan_outs(client: Client, n: int) -> list[str]:
    return [client.submit(client.request("src", session_ids=[f"b{i}-{j}" for j in range(3)], request_id=f"b{i}"))
            for i in range(n)]


def test_the_next_batch_begins_before_a_batch_ends_and_the_worker_stays_busy(redis: Redis,
                                                                             registry: Registry) -> None:
    """Three fan-outs of 3 with ``batch_children=3``: three batches of one take. Each batch is
    prepared while the one before it is in flight, and begins before that one ends: when a batch's
    end starts, the next batch's request is claimed on the server and the batch's own outcome is
    not stored yet (the overlap happened). A batch ended while a later one runs leaves RQ's worker
    busy with it (RQ 2: its job the current one); the last leaves it idle. Every request is
    answered as alone."""
    registry.append(registry.create("src"), [*_turn()])
    client = Client(redis)
    ids = _fan_outs(client, 3)
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    service, worker = _run(redis, registry, 3)
    service.look = lambda: {
        "claimed": [bool(redis.exists(keys.request(r))) for r in ids],
        "stored": [outcomes.get(r) is not None for r in ids],
        "state": redis.hget(worker.key, "state"), "current": redis.hget(worker.key, "current_job")}
    assert worker.work(burst=True, logging_level="WARNING") is True
    # Each batch prepared while the one begun before it is in flight (b1 is prepared to learn that
    # it does not fit in b0's batch).
    assert service.steps == [("prepare", ["b0"]), ("prepare", ["b1"]), ("begin", ["b0"]), ("prepare", ["b2"]),
                             ("begin", ["b1"]), ("end", ["b0"]), ("begin", ["b2"]), ("end", ["b1"]), ("end", ["b2"])]
    first, second, third = service.at_end
    assert first["claimed"] == [True, True, False] and first["stored"] == [False, False, False]
    assert second["claimed"] == [True, True, True] and second["stored"] == [True, False, False]
    assert third["stored"] == [True, True, False]
    # A later batch runs: RQ's worker busy with it (RQ 2 names it its current job; RQ 3 has none).
    assert [a["state"] for a in service.after_end[:2]] == [b"busy", b"busy"]
    assert [a["current"] for a in service.after_end[:2]] == ([None, None] if RQ_MAJOR >= 3 else [b"b1", b"b2"])
    assert service.after_end[2]["state"] == b"idle" and service.after_end[2]["current"] is None
    for i, request_id in enumerate(ids):
        reply = outcomes.get(request_id)
        assert isinstance(reply, ForkResult) and reply.ok, reply
        assert [h.id for h in reply.sessions or []] == [f"b{i}-{j}" for j in range(3)]
        assert all(h.seed_length == TURN_EVENTS for h in reply.sessions or [])
    assert sorted(e.request for e in outcome_entries(redis)) == sorted(ids)  # announced once each
    queue = queue_of(client)
    assert StartedJobRegistry(queue=queue).get_job_ids() == []
    assert sorted(FinishedJobRegistry(queue=queue).get_job_ids()) == sorted(ids)
    assert redis.llen(queue.intermediate_queue_key) == 0


def test_a_batch_with_merges_ends_before_the_next_begins(redis: Redis, registry: Registry) -> None:
    """A merge's steps run when its batch ends: the batch ends before the next begins, so the next
    batch's source steps see the merged parent (as without batches)."""
    family(registry, "src", ["m-kid"])
    client = Client(redis)
    fan = client.submit(client.request("src", session_ids=["f0", "f1", "f2"], request_id="fan"))
    one = client.submit(client.request("src", session_id="one-child", request_id="one"))
    merge = client.submit(client.merge_request("src", "m-kid", mode="events", request_id="merge"))
    after = client.submit(client.request("src", session_ids=["a0", "a1", "a2"], request_id="after"))
    service, worker = _run(redis, registry, 3)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert [step for step in service.steps if step[0] != "prepare"] == [
        ("begin", [fan]), ("begin", [one, merge]), ("end", [fan]), ("end", [one, merge]), ("begin", [after]),
        ("end", [after])]
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    first, merged, forked = outcomes.get(fan), outcomes.get(merge), outcomes.get(after)
    assert isinstance(merged, MergeResult), merged
    assert isinstance(first, ForkResult) and isinstance(forked, ForkResult) and forked.ok, (first, forked)
    before = {h.seed_length for h in first.sessions or []}
    assert {h.seed_length for h in forked.sessions or []} == {merged.length} != before  # the merged parent


def test_a_batch_whose_beginning_fails_runs_each_request_alone_after_the_batch_ahead_ends(
        redis: Redis, registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected exception in a batch's beginning: the batch ahead of it ends (its records and
    RQ's finish, the worker then idle), then each of the failed batch's requests runs on its own,
    a batch of one through the same begin and end; every request has its one outcome."""
    registry.append(registry.create("src"), [*_turn()])
    client = Client(redis)
    ids = _fan_outs(client, 3)
    service, worker = _run(redis, registry, 3)
    service.fail_begin = {"b1"}
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert [step for step in service.steps if step[0] != "prepare"] == [
        ("begin", ["b0"]), ("begin", ["b1"]), ("end", ["b0"]), ("begin", ["b1"]), ("end", ["b1"]),
        ("begin", ["b2"]), ("end", ["b2"])]
    assert "a batch of 1 requests failed; running each on its own" in caplog.text
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    for i, request_id in enumerate(ids):
        reply = outcomes.get(request_id)
        assert isinstance(reply, ForkResult) and [h.id for h in reply.sessions or []] == [f"b{i}-{j}" for j in
                                                                                         range(3)], reply
    assert sorted(e.request for e in outcome_entries(redis)) == sorted(ids)
    queue = queue_of(client)
    assert sorted(FinishedJobRegistry(queue=queue).get_job_ids()) == sorted(ids)
    assert redis.hget(worker.key, "state") == b"idle"


def _turn() -> list[Any]:
    from sessionfork import NewEvent

    return [NewEvent("turn/start", {}), NewEvent("turn/end", {"reason": "done"})]

