"""Batches (``SESSIONFORK_BATCH``): a worker takes every waiting request up to the batch size in one
round trip and answers each as it would alone; RQ's bookkeeping of a batch is RQ's own (the same
keys, fields and registries as a job run on its own, on RQ 3 and 2.12); a poison entry is refused
alone; a fan-out never holds the batch's other replies; ``max_jobs`` counts jobs."""

from __future__ import annotations

import base64
import re
import socket
import threading
import time
import zlib
from typing import Any, ClassVar

import msgspec
import pytest
from cluster_fixtures import assert_no_crossslot, completed_source
from helpers import family, outcome_entries, queue_of
from redis import Redis
from redis.exceptions import NoScriptError
from rq.executions import Execution
from rq.job import Job
from rq.registry import FinishedJobRegistry, StartedJobRegistry
from waits import outcome_of, wait_until

from sessionfork import NewEvent, Registry
from sessionfork.clients.client import Client
from sessionfork.core import merges, wire
from sessionfork.core.config import Settings, from_environ
from sessionfork.core.wire import ForkFailure, ForkResult, MergeFailure, MergeResult, SelectResult
from sessionfork.embedded import EmbeddedCluster, EmbeddedServer
from sessionfork.ops import pauses
from sessionfork.protocol.requests import Limits
from sessionfork.protocol.shards import shard_of
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.rq_seam.entries import DequeuedJob, Taken
from sessionfork.worker.rq_seam.riders import Finished, Started
from sessionfork.worker.service import RequestService

pytestmark = pytest.mark.rq

TURN = [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})]


class Counting(RequestWorker):
    """Records the size of every ``take`` that found entries, the jobs of every batch, and every
    job run on its own (a batch of one, or refused)."""

    takes: ClassVar[list[int]]
    alone: ClassVar[list[str]]
    batches: ClassVar[list[list[str]]]

    def take(self, count: int) -> Taken:
        taken = super().take(count)
        if taken.entries:
            self.takes.append(len(taken.entries))
        return taken

    def _run_alone(self, batch: Any) -> None:
        self.alone.extend(job.id for job, _, _ in batch.items)
        super()._run_alone(batch)

    def _refuse(self, job: Job, queue: Any, reason: str) -> None:
        self.alone.append(job.id)
        super()._refuse(job, queue, reason)

    def _begin(self, batch: Any) -> Any:
        self.batches.append([job.id for job, _, _ in batch.items])
        return super()._begin(batch)


def _service(redis: Redis, registry: Registry, shard: tuple[int, int] | None = None,
             batch_children: int = Settings().batch_children) -> RequestService:
    return RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=10_000), reply_channel="sf:replies",
                       limits=Limits(max_fanout=1024), shard=shard, batch_children=batch_children)


def _worker(redis: Redis, registry: Registry, batch: int, queue: str = Settings().queue,
            shard: tuple[int, int] | None = None, on_outcome: Any = None,
            batch_children: int = Settings().batch_children) -> Counting:
    Counting.takes, Counting.alone, Counting.batches = [], [], []
    return Counting([jobs.make_queue(redis, Settings(queue=queue))],
                    service=_service(redis, registry, shard, batch_children),
                    connection=redis, abandoned_after=30, batch=batch, on_outcome=on_outcome)


def _submit(client: Client, n: int, prefix: str, source: str = "src") -> list[str]:
    return [client.submit(client.request(source, session_id=f"{prefix}-child-{i}", request_id=f"{prefix}-{i}"))
            for i in range(n)]


def test_a_batch_takes_the_waiting_requests_in_one_take_and_answers_each(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    ids = _submit(client, 10, "b")
    worker = _worker(redis, registry, 16)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [10] and Counting.alone == []  # one take, every request in the batch
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    for i, request_id in enumerate(ids):
        reply = outcomes.get(request_id)
        assert isinstance(reply, ForkResult) and reply.child.id == f"b-child-{i}", reply
        assert reply.child.parent_session == "src" and reply.child.seed_length == 2
    assert sorted(e.request for e in outcome_entries(redis)) == sorted(ids)  # announced once each
    queue = queue_of(client)
    assert queue.count == 0 and redis.llen(queue.intermediate_queue_key) == 0
    assert StartedJobRegistry(queue=queue).get_job_ids() == []
    assert sorted(FinishedJobRegistry(queue=queue).get_job_ids()) == sorted(ids)
    for request_id in ids:
        job = Job.fetch(request_id, connection=redis, serializer=jobs.JSONSerializer)
        assert str(getattr(job.get_status(), "value", job.get_status())) == "finished"
        assert job.return_value() == msgspec.json.decode(wire.encode(outcomes.get(request_id)))  # the outcome


def _rq_keys(redis: Redis, ids: list[str], queue: str) -> dict[str, str]:
    """Every RQ key on the server, its name with the job ids, queue and execution ids masked, mapped
    to its type (the keys two paths write for the same jobs compare equal)."""
    out: dict[str, str] = {}
    for key in redis.scan_iter("rq:*"):
        name = key.decode()
        if name.startswith(("rq:worker", "rq:workers", "rq:pubsub", "rq:maintenance")):
            continue  # the worker's own (one per worker process, not per job)
        if queue not in name and not any(request_id in name for request_id in ids):
            continue  # the other path's
        for i, request_id in enumerate(ids):
            name = name.replace(request_id, f"<job{i}>")
        name = re.sub(r"<job(\d+)>:[0-9a-z]+$", r"<job\1>:<execution>", name.replace(queue, "<queue>"))
        out[name] = redis.type(key).decode()
    return out


def test_rqs_bookkeeping_of_a_batch_is_the_bookkeeping_of_jobs_run_alone(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    alone_client, batch_client = (Client(redis, Settings(queue=name)) for name in ("q-alone", "q-batch"))
    alone_ids, batch_ids = _submit(alone_client, 3, "alone"), _submit(batch_client, 3, "batch")
    _worker(redis, registry, 1, "q-alone").work(burst=True, logging_level="WARNING")
    assert Counting.takes == [] and Counting.alone == alone_ids  # RQ's dequeue, one job at a time
    _worker(redis, registry, 8, "q-batch").work(burst=True, logging_level="WARNING")
    assert Counting.takes == [3] and Counting.alone == []  # one batch
    alone_keys = _rq_keys(redis, alone_ids, "q-alone")
    batch_keys = _rq_keys(redis, batch_ids, "q-batch")
    assert batch_keys == alone_keys and len(batch_keys) >= 6
    for a, b in zip(alone_ids, batch_ids, strict=True):
        alone_hash, batch_hash = redis.hgetall(f"rq:job:{a}"), redis.hgetall(f"rq:job:{b}")
        assert sorted(alone_hash) == sorted(batch_hash)  # the same fields
        for field in (b"status", b"timeout", b"result_ttl", b"failure_ttl", b"retries_left", b"data"):
            assert batch_hash.get(field) == alone_hash.get(field) or field == b"data", field
        assert batch_hash[b"origin"] == b"q-batch" and alone_hash[b"origin"] == b"q-alone"
        assert batch_hash[b"worker_name"] and batch_hash[b"started_at"] and batch_hash[b"ended_at"]
        assert 0 < redis.ttl(f"rq:job:{b}") <= redis.ttl(f"rq:job:{a}") + 5  # RQ's result TTL, the same
        batch_job = Job.fetch(b, connection=redis, serializer=jobs.JSONSerializer)
        alone_job = Job.fetch(a, connection=redis, serializer=jobs.JSONSerializer)
        assert batch_job.get_status() == alone_job.get_status()
        assert batch_job.worker_name and batch_job.started_at and batch_job.ended_at
        assert batch_job.ended_at >= batch_job.started_at


def test_a_poison_entry_in_a_batch_is_refused_alone_while_the_others_succeed(redis: Redis,
                                                                              registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    first = _submit(client, 3, "p")
    queue = queue_of(client)
    other = queue.enqueue_call("os.getcwd", job_id="not-a-fork")  # a job of another function
    redis.rpush(queue.key, b"no-such-job", b"bad:id", b"\xff\xfe")
    last = [client.submit(client.request("src", session_id=f"q-child-{i}", request_id=f"q-{i}")) for i in range(3)]
    worker = _worker(redis, registry, 16)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [10]  # every entry in one take: the poison shared the batch
    assert Counting.alone == [other.id]  # the job of another function ran alone (refused)
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    for request_id in first + last:
        assert isinstance(outcomes.get(request_id), ForkResult), request_id
    for entry in ("not-a-fork", "no-such-job", "bad:id"):
        refused = outcomes.get(entry)
        assert isinstance(refused, ForkFailure) and refused.code == "INVALID_REQUEST", entry
    assert redis.hget(b"sf:req:\xff\xfe", "outcome") is not None
    assert queue.count == 0 and redis.llen(queue.intermediate_queue_key) == 0
    assert StartedJobRegistry(queue=queue).get_job_ids() == []


def test_fan_outs_join_a_batch_while_their_children_fit_in_batch_children(redis: Redis,
                                                                          registry: Registry) -> None:
    """A fan-out whose children fit in what is left of ``batch_children`` (a plain fork counts
    one) runs in the batch, answered as alone (its children, its failures); one that does not fit
    starts the next batch, which the requests after it join; one larger than ``batch_children``
    runs alone after the batches."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    first = client.submit(client.request("src", count=3, request_id="fan-a"))
    ids = client.submit(client.request("src", session_ids=["x", "taken"], request_id="fan-b"))
    one = client.submit(client.request("src", request_id="one", session_id="one-child"))
    over = client.submit(client.request("src", count=3, request_id="fan-c"))  # 6 of 8 used: 3 do not fit
    huge = client.submit(client.request("src", count=9, request_id="fan-d"))  # 9 > 8: no batch holds it
    last = client.submit(client.request("src", request_id="last", session_id="last-child"))
    registry.create("taken")
    worker = _worker(redis, registry, 8, batch_children=8)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [6]  # the race: the budget split the take
    assert Counting.batches == [[first, ids, one], [over, last]] and Counting.alone == [huge]
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    a, b, c, d = (outcomes.get(r) for r in (first, ids, over, huge))
    assert isinstance(a, ForkResult) and a.ok and len(a.sessions or []) == 3
    assert isinstance(b, ForkResult) and not b.ok and [h.id for h in b.sessions or []] == ["x"]
    assert [(f.session_id, f.code) for f in b.failed or []] == [("taken", "SESSION_ALREADY_EXISTS")]
    assert isinstance(c, ForkResult) and c.ok and len(c.sessions or []) == 3
    assert isinstance(d, ForkResult) and d.ok and len(d.sessions or []) == 9
    for rid, child in ((one, "one-child"), (last, "last-child")):
        reply = outcomes.get(rid)
        assert isinstance(reply, ForkResult) and reply.session is not None and reply.session.id == child
    order = [e.request for e in outcome_entries(redis)]
    assert sorted(order[:3]) == sorted([first, ids, one]) and sorted(order[3:5]) == sorted([over, last])
    assert order[5:] == [huge]
    assert sorted(registry.children("src")) == sorted(
        [*(h.id for h in a.sessions or []), "x", "one-child", *(h.id for h in c.sessions or []), "last-child",
         *(h.id for h in d.sessions or [])])


def test_a_batchs_child_steps_stream_each_forks_children_made_before_the_next_is_built(
        redis: Redis, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """On one server a batch's child steps stream (``CallStream``): a fork's calls reach the server
    as soon as they are built, so its children exist while the next fork's step is built; each
    fork is answered as alone."""
    from sessionfork import embedded
    from sessionfork.core.fork_steps import ForkSteps

    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    specs = [("one", ["one-a", "one-b"]), ("two", ["two-a", "two-b"]), ("three", ["three-a"])]
    for request_id, ids in specs:
        client.submit(client.request("src", session_ids=ids, request_id=request_id))
    seen: list[bool] = []  # at each fork's step after the first: the previous fork's children exist
    built: list[list[str]] = []
    child_step = ForkSteps.child_step

    def watched(self: ForkSteps, snap: Any, spec: Any, child_ids: Any = None) -> Any:
        if built:
            earlier = built[-1]

            def made() -> bool:
                return bool(redis.exists(*(f"sf:s:{{{c}}}" for c in earlier)) == len(earlier))

            try:
                embedded.wait_until(made, 5, "the previous fork's children")
                seen.append(True)
            except TimeoutError:
                seen.append(False)
        built.append(list(spec.child_ids if child_ids is None else child_ids))
        return child_step(self, snap, spec, child_ids)

    monkeypatch.setattr(ForkSteps, "child_step", watched)
    # Loaded, as a running worker's scripts are: a script's first call on a server is NOSCRIPT,
    # run again at the read.
    redis.script_load(registry.forks.state.scripts.script("create_many").script)
    worker = _worker(redis, registry, 8)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.batches == [["one", "two", "three"]]
    assert seen == [True, True]  # each fork's children made while the next fork's step was built
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    for request_id, ids in specs:
        reply = outcomes.get(request_id)
        assert isinstance(reply, ForkResult) and reply.ok and [h.id for h in reply.sessions or []] == ids, reply
    assert sorted(registry.children("src")) == sorted(c for _, ids in specs for c in ids)


def test_a_batchs_fan_outs_keep_their_snapshots_in_one_transaction(redis: Redis, registry: Registry) -> None:
    """Every new fan-out of a batch keeps its snapshot before any child exists, the batch's all in
    one transaction: a batch of three fan-outs runs as many transactions as a batch of one."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)

    def transactions(fan_outs: int, tag: str) -> int:
        fans = [client.submit(client.request("src", count=2, request_id=f"{tag}-fan-{i}")) for i in range(fan_outs)]
        _submit(client, 1, tag)  # a plain fork: the take holds more than one entry, so it is a batch
        redis.config_resetstat()
        worker = _worker(redis, registry, 8)
        assert worker.work(burst=True, logging_level="WARNING") is True
        assert len(Counting.batches) == 1 and len(Counting.batches[0]) == fan_outs + 1 and Counting.alone == []
        for fan in fans:
            reply = Outcomes(redis, ttl=600, stream_maxlen=10).get(fan)
            assert isinstance(reply, ForkResult) and reply.ok and len(reply.sessions or []) == 2
        info = redis.info("commandstats")
        assert info["cmdstat_hsetnx"]["calls"] == fan_outs  # each fan-out kept its snapshot
        return int(info["cmdstat_multi"]["calls"])

    assert transactions(3, "three") == transactions(1, "one")


def test_the_batch_children_setting_reaches_the_worker(redis: Redis, registry: Registry) -> None:
    settings = from_environ({"SESSIONFORK_BATCH_CHILDREN": "3"})
    service = RequestService.from_settings(registry, redis, settings)
    assert service.batch_children == 3
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    payload = wire.encode(client.request("src", request_id="bc-1", count=4))
    assert service.prepare(payload, "bc-1").alone  # 4 > 3: a batch of its own


def test_a_fan_out_in_a_batch_never_holds_the_other_replies(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    big = client.submit(client.request("src", count=1024, request_id="big"))  # first in the queue
    singles = _submit(client, 5, "s")
    worker = _worker(redis, registry, 8)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [6] and Counting.alone == [big]  # the race: the fan-out was in the batch
    order = [e.request for e in outcome_entries(redis)]
    assert order[-1] == big and sorted(order[:-1]) == sorted(singles)  # every single's reply came first
    reply = Outcomes(redis, ttl=600, stream_maxlen=10).get(big)
    assert isinstance(reply, ForkResult) and len(reply.children) == 1024


def test_merges_in_a_batch_answer_each_as_alone_and_step_their_parent_in_queue_order(
        redis: Redis, registry: Registry) -> None:
    """Merges join a batch (a select runs alone, as a fan-out does): each answers as alone, the
    refusals in their documented order, a replay its first merge; the parent's steps run in the
    queue's order (each merge's turn after the one before it), so a second merge of a range the
    batch merged already is ``ALREADY_MERGED``."""
    kids = [f"bk{i}" for i in range(6)]
    family(registry, "mp", kids)
    registry.create("stranger")
    first = merges.merge(registry, "mp", "bk5", mode="summary", summary={"n": 5}, request_id="m-done")
    client = Client(redis)
    submitted = [client.submit(request) for request in [
        client.merge_request("mp", "bk0", mode="summary", summary={"n": 0}, request_id="m-0"),
        client.merge_request("mp", "bk1", mode="events", request_id="m-1"),
        client.request("mp", session_id="mp-fork", request_id="f-0"),
        client.merge_request("mp", "bk2", mode="events", if_parent_length=999, request_id="m-2"),
        client.merge_request("mp", "stranger", mode="events", request_id="m-3"),
        client.merge_request("mp", "bk3", mode="summary", summary={"n": 3}, request_id="m-4a"),
        client.merge_request("mp", "bk3", mode="summary", summary={"n": 3}, request_id="m-4b"),
        client.merge_request("mp", "bk5", mode="summary", summary={"n": 5}, request_id="m-done"),
        client.select_request("mp", ["bk4", "bk2"], "bk4", mode="events", request_id="sel"),
        client.merge_request("mp", "bk2", mode="events", range=(0, 3), request_id="m-5"),
    ]]
    worker = _worker(redis, registry, 16)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [10] and Counting.alone == ["sel"]  # the race: every merge in the batch
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    got = {request_id: outcomes.get(request_id) for request_id in submitted}
    spans = {r: (g.from_seq, g.length) for r, g in got.items() if isinstance(g, MergeResult)}
    assert spans == {"m-0": (8, 12), "m-1": (12, 19), "m-4a": (19, 23), "m-done": (first.first, first.length)}
    codes = {r: g.code for r, g in got.items() if isinstance(g, MergeFailure)}
    assert codes == {"m-2": "PRECONDITION_FAILED", "m-3": "NOT_DESCENDANT", "m-4b": "ALREADY_MERGED",
                     "m-5": "INVALID_BOUNDARY"}, codes
    forked, selected = got["f-0"], got["sel"]
    # The fork's source step (the batch's first trip) saw the parent before the batch's merges.
    assert isinstance(forked, ForkResult) and (forked.child.parent_session, forked.child.seed_length) == ("mp", 8)
    assert isinstance(selected, SelectResult) and (selected.from_seq, selected.length) == (23, 30)
    assert [registry.state_of(k).state for k in kids] == ["merged", "merged", "abandoned", "merged", "merged",
                                                          "merged"]
    triggers = [e.seq for e in registry.events("mp") if e.type == "turn/start" and e.data.get("trigger") == "merge"]
    assert triggers == [4, 8, 12, 19, 23]  # each merge one whole turn, in the queue's order
    assert sorted(e.request for e in outcome_entries(redis)) == sorted(submitted)  # announced once each
    assert redis.llen(queue_of(client).intermediate_queue_key) == 0


def test_merges_in_a_batch_on_a_cluster_registry_step_each_session_on_its_own_slot(
        redis: Redis, cluster: EmbeddedCluster, cluster_registry: Registry) -> None:
    """On a Redis Cluster registry (parent and children on several slots), merges in one batch answer
    as alone, with no cross-slot command."""
    kids = [f"cbk{i}" for i in range(4)]
    family(cluster_registry, "cmp", kids)
    client = Client(redis)
    ids = [client.submit(client.merge_request("cmp", kid, mode="summary", summary={"kid": kid},
                                              request_id=f"cm-{kid}")) for kid in kids]
    again = client.submit(client.merge_request("cmp", kids[0], mode="summary", summary={}, request_id="cm-again"))
    worker = _worker(redis, cluster_registry, 16)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [5] and Counting.alone == []
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    spans = [(r.from_seq, r.length) if isinstance(r, MergeResult) else r for r in map(outcomes.get, ids)]
    assert spans == [(4, 8), (8, 12), (12, 16), (16, 20)]
    refused = outcomes.get(again)
    assert isinstance(refused, MergeFailure) and refused.code == "ALREADY_MERGED", refused
    assert [cluster_registry.state_of(k).state for k in kids] == ["merged"] * 4
    assert cluster_registry.length("cmp") == 20
    assert_no_crossslot(cluster)


def test_a_batch_on_a_cluster_registry_answers_each_request_as_alone(
        redis: Redis, cluster: EmbeddedCluster, cluster_registry: Registry) -> None:
    """The queue on its own server, the registry on a cluster (the sources and children on several
    slots): one take, each request its own outcome and child, a taken id and a missing source
    refused in the batch, two requests for one new child id (the first in the queue makes it, the
    second is ``SESSION_ALREADY_EXISTS``), a fan-out (its children pinned under their parent first,
    as alone), every child indexed under its parent, no cross-slot command."""
    sources = ["bt-a", "bt-b", "bt-c"]
    for source in sources:
        completed_source(cluster_registry, source)
    cluster_registry.create("bt-taken")
    client = Client(redis)
    ids = [client.submit(client.request(sources[i % 3], session_id=f"bt-child-{i}", request_id=f"bt-{i}"))
           for i in range(9)]
    taken = client.submit(client.request("bt-a", session_id="bt-taken", request_id="bt-taken-req"))
    missing = client.submit(client.request("bt-gone", session_id="bt-x", request_id="bt-gone-req"))
    twice = [client.submit(client.request("bt-b", session_id="bt-dup", request_id=f"bt-dup-{i}")) for i in (1, 2)]
    fan_ids = ["bt-f0", "bt-f1", "bt-f2"]
    fan = client.submit(client.request("bt-c", session_ids=fan_ids, request_id="bt-fan"))
    worker = _worker(redis, cluster_registry, 16)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [14] and Counting.alone == []  # the race: all of them in one batch
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    for i, request_id in enumerate(ids):
        reply = outcomes.get(request_id)
        assert isinstance(reply, ForkResult) and reply.child.id == f"bt-child-{i}", reply
        assert reply.child.parent_session == sources[i % 3] and reply.child.seed_length == 4
    refused = outcomes.get(taken), outcomes.get(missing)
    assert [r.code if isinstance(r, ForkFailure) else r for r in refused] == ["SESSION_ALREADY_EXISTS",
                                                                               "SESSION_NOT_FOUND"]
    first, second = (outcomes.get(request_id) for request_id in twice)
    assert isinstance(first, ForkResult) and first.child.id == "bt-dup", first
    assert isinstance(second, ForkFailure) and second.code == "SESSION_ALREADY_EXISTS", second
    fanned = outcomes.get(fan)
    assert isinstance(fanned, ForkResult) and fanned.ok and [h.id for h in fanned.sessions or []] == fan_ids
    for k, source in enumerate(sources):
        more = {"bt-b": ["bt-dup"], "bt-c": fan_ids}.get(source, [])
        assert cluster_registry.children(source) == sorted([*more, *(f"bt-child-{i}" for i in range(k, 9, 3))])
        assert [e.type for e in cluster_registry.events(f"bt-child-{k}")] == \
            [e.type for e in cluster_registry.events(source)]
    assert cluster_registry.exists("bt-taken") and not cluster_registry.exists("bt-x")
    assert sorted(e.request for e in outcome_entries(redis)) == sorted([*ids, taken, missing, *twice, fan])
    assert_no_crossslot(cluster)


def test_a_batch_on_a_sharded_queue_forks_its_own_shards_requests_and_refuses_another_shards(
        registry: Registry) -> None:
    """Shard 0 of two: its worker takes its shard's requests and one routed by another shard list
    in one batch; that one is refused ``WRONG_SHARD`` in the batch, every other forks."""
    registry.append(registry.create("src"), TURN)
    own = [f"sh-{i}" for i in range(40) if shard_of(f"sh-{i}", 2) == 0][:6]
    other = next(f"sh-{i}" for i in range(40) if shard_of(f"sh-{i}", 2) == 1)
    with EmbeddedServer() as shard0, shard0.client() as queue_redis:
        client = Client(queue_redis)  # a producer with no shard list: everything on this server
        for request_id in [*own[:3], other, *own[3:]]:
            client.submit(client.request("src", session_id=f"{request_id}-child", request_id=request_id))
        worker = _worker(queue_redis, registry, 16, shard=(0, 2))
        assert worker.work(burst=True, logging_level="WARNING") is True
        assert Counting.takes == [7] and Counting.alone == []  # one batch, the refusal in it
        assert Counting.batches == [[*own[:3], other, *own[3:]]]
        outcomes = Outcomes(queue_redis, ttl=600, stream_maxlen=10)
        for request_id in own:
            reply = outcomes.get(request_id)
            assert isinstance(reply, ForkResult) and reply.child.id == f"{request_id}-child", reply
        wrong = outcomes.get(other)
        assert isinstance(wrong, ForkFailure) and wrong.code == "WRONG_SHARD", wrong
        assert registry.children("src") == sorted(f"{r}-child" for r in own)
        assert sorted(e.request for e in outcome_entries(queue_redis)) == sorted([*own, other])


def test_an_idle_batched_worker_serves_a_lone_request_at_once_alone(redis: Redis, registry: Registry) -> None:
    """A worker with batches whose queue is empty blocks in its wait (RQ's BLMOVE, with the job's
    hash read behind it); a request arriving then is served from that wait at once, alone: no
    take, no wait for a batch to fill."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    worker = _worker(redis, registry, 32)
    answered: list[float] = []  # seconds from the submit to the stored outcome

    def submit_once_blocked() -> None:
        # The worker's connection is blocked (CLIENT LIST flag "b") in its wait: then submit.
        wait_until(lambda: any("b" in c["flags"] and c["cmd"] in {"blmove", "brpoplpush"} for c in redis.client_list()),
                   30, "the worker blocked in its dequeue")
        began = time.monotonic()
        client.submit(client.request("src", session_id="lone-child", request_id="lone"))
        outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
        wait_until(lambda: outcomes.get("lone") is not None, 30, "the lone request's outcome")
        answered.append(time.monotonic() - began)

    helper = threading.Thread(target=submit_once_blocked)
    helper.start()
    assert worker.work(burst=False, logging_level="WARNING", max_jobs=1) is True
    helper.join(30)
    assert Counting.takes == [] and Counting.alone == ["lone"]  # from the wait, alone
    reply = Outcomes(redis, ttl=600, stream_maxlen=10).get("lone")
    assert isinstance(reply, ForkResult) and reply.child.id == "lone-child"
    assert answered and answered[0] < 2.0  # at once: no wait for a batch to fill (two seconds are generous)


def test_the_outcome_hook_gets_each_jobs_latency_in_a_batch_and_alone(redis: Redis, registry: Registry) -> None:
    """The worker's ``on_outcome`` (the metrics and log line) gets every job's enqueue-to-outcome
    latency: the batch's forks' and the fan-out's that runs alone after them."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    singles = _submit(client, 3, "lat")
    fan = client.submit(client.request("src", count=5, request_id="lat-fan"))  # 5 children: no batch holds them
    seen: dict[str, float | None] = {}
    worker = _worker(redis, registry, 8, on_outcome=lambda request_id, _payload, _reply, _seconds, latency=None:
                     seen.__setitem__(request_id, latency), batch_children=4)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [4] and Counting.alone == [fan]  # both paths ran
    assert sorted(seen) == sorted([fan, *singles])
    assert all(latency is not None and 0 <= latency < 60 for latency in seen.values()), seen


def test_a_job_alone_sends_each_of_its_4_round_trips_in_one_write(redis: Redis, registry: Registry,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One request at a time (``SESSIONFORK_BATCH=1``), a job's 4 round trips (dequeue with the job
    hash, RQ's start with the claim and source step, the child, the record with RQ's finish) are 4
    writes on the socket: each pipeline, its scripts' ``EVAL`` text included (``lua.compact``),
    fits redis-py's one write. Counted at the socket, so the server's timing cannot hide a
    pipeline split in two."""
    registry.append(registry.create("src"), TURN)
    n = 200
    _submit(Client(redis), n, "w")
    worker = _worker(redis, registry, 1)
    worker.work(burst=True, logging_level="WARNING", max_jobs=1)  # registered, scripts loaded: the rest is jobs
    writes = [0]
    sendall = socket.socket.sendall

    def counted(self: socket.socket, data: Any, *args: Any) -> None:
        writes[0] += 1
        sendall(self, data, *args)

    monkeypatch.setattr(socket.socket, "sendall", counted)
    worker = _worker(redis, registry, 1)
    worker.work(burst=True, logging_level="WARNING")
    monkeypatch.undo()
    assert Outcomes(redis, ttl=600, stream_maxlen=10).get(f"w-{n - 1}") is not None
    assert writes[0] / (n - 1) <= 4.5, writes[0] / (n - 1)  # a worker's start and stop: a few dozen


def test_a_server_that_loses_its_scripts_under_a_take_pauses_the_worker_it_does_not_end_it(
        redis: Redis, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that restarts empty (or is flushed) between redis-py's load of a script and its
    re-run answers NOSCRIPT twice (seen in CI: the idle worker of a server killed and restarted
    died of it): the step failed without running, so it is an outage, run again after a back-off,
    and the worker serves on."""
    registry.append(registry.create("src"), TURN)
    ids = _submit(Client(redis), 3, "ns")
    worker = _worker(redis, registry, 8)
    take = worker._scripts.script("take")
    calls = [0]
    run = type(take).__call__

    def lost_twice(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if self is take and calls[0] <= 2:  # redis-py's first call and its re-run after the load
            raise NoScriptError("No matching script. Please use EVAL.")
        return run(self, *args, **kwargs)

    monkeypatch.setattr(type(take), "__call__", lost_twice)
    assert outcome_of(lambda: worker.work(burst=True, logging_level="WARNING")) is True
    assert calls[0] > 2 and Counting.takes == [3]
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    assert all(isinstance(outcomes.get(request_id), ForkResult) for request_id in ids)


def test_max_jobs_counts_jobs_not_batches(redis: Redis, registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    ids = _submit(client, 10, "m")
    worker = _worker(redis, registry, 16)
    assert worker.work(burst=True, logging_level="WARNING", max_jobs=4) is True
    assert Counting.takes == [4]
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    assert [outcomes.get(i) is not None for i in ids] == [True] * 4 + [False] * 6
    assert queue_of(client).job_ids == ids[4:]


def test_a_replay_and_a_repeated_entry_in_a_batch_keep_one_outcome_and_one_child(redis: Redis,
                                                                                registry: Registry) -> None:
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    done = _submit(client, 1, "r")
    _worker(redis, registry, 8).work(burst=True, logging_level="WARNING")
    first = Outcomes(redis, ttl=600, stream_maxlen=10).get(done[0])
    fresh = _submit(client, 1, "twice")
    queue = queue_of(client)
    redis.rpush(queue.key, done[0], fresh[0])  # a finished request again, and a new one twice
    _worker(redis, registry, 8).work(burst=True, logging_level="WARNING")
    assert Counting.takes == [3]
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    assert outcomes.get(done[0]) == first
    replayed = Job.fetch(done[0], connection=redis, serializer=jobs.JSONSerializer)
    assert replayed.return_value() == msgspec.json.decode(wire.encode(first))  # RQ's result: the first outcome
    reply = outcomes.get(fresh[0])
    assert isinstance(reply, ForkResult) and reply.child.id == "twice-child-0"
    assert sorted(e.request for e in outcome_entries(redis)) == sorted([done[0], fresh[0]])  # once each
    assert registry.children("src") == sorted(["r-child-0", "twice-child-0"])
    assert StartedJobRegistry(queue=queue).get_job_ids(cleanup=False) == []  # each run's execution cleaned up
    assert redis.llen(queue.intermediate_queue_key) == 0


def test_with_forks_waiting_for_replicas_every_request_runs_alone(redis: Redis) -> None:
    waiting = Registry(redis, wait_replicas=1, wait_timeout_ms=10)
    plain = Registry(redis)
    plain.append(plain.create("src"), TURN)
    payload = wire.encode(Client(redis).request("src", request_id="w-1", session_id="w-child"))
    assert not _service(redis, plain).prepare(payload, "w-1").alone  # batched without WAIT
    assert _service(redis, waiting).prepare(payload, "w-1").alone  # its own WAIT: a batch of its own


def test_a_fan_out_left_out_of_a_batch_has_its_ids_generated_once(redis: Redis, registry: Registry) -> None:
    """``prepare`` generates a fan-out's ids once, whether it joins a batch or runs as a batch of
    its own: its run creates exactly those."""
    registry.append(registry.create("src"), TURN)
    made: list[str] = []

    def new_id() -> str:
        made.append(f"gen-{len(made)}")
        return made[-1]

    service = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=10_000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=1024), new_id=new_id, batch_children=2)
    client = Client(redis)
    fan = service.prepare(wire.encode(client.request("src", request_id="f-1", count=3)), "f-1")
    one = service.prepare(wire.encode(client.request("src", request_id="f-2", count=1)), "f-2")
    assert fan.alone and not one.alone  # 3 > 2: a batch of its own; a fan-out of one: batched
    assert made == ["gen-0", "gen-1", "gen-2", "gen-3"]
    (reply,) = service.run([fan])
    assert isinstance(reply, ForkResult) and [h.id for h in reply.sessions or []] == ["gen-0", "gen-1", "gen-2"]
    assert made == ["gen-0", "gen-1", "gen-2", "gen-3"]  # none generated again


_MASKS = ((re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z"), "<time>"), (re.compile(r"\b\d{10}\.\d+\b"), "<stamp>"),
          (re.compile(r"\b\d{13}\b"), "<ms>"), (re.compile(r"[0-9a-f]{40}|[0-9a-f]{32}"), "<hex>"))


def _masked(value: Any, side: str, field: bytes = b"") -> Any:
    """A value as both paths write it: bytes decoded (a job's ``data`` decompressed, a result's
    ``return_value`` decoded), the side's name, ids and times masked."""
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            value = msgspec.json.decode(zlib.decompress(value))  # a job's data: what it says, not its bytes
    text = str(value)
    if field == b"return_value":
        text = str(msgspec.json.decode(base64.b64decode(text)))  # RQ's result: the outcome it holds
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return text.replace(side, "<side>")


def _rq_state(redis: Redis, side: str, worker: str) -> dict[str, Any]:
    """Every RQ key of one side (its keys name ``side`` or its ``worker``): masked name -> type,
    contents (masked; scores and times to live as seconds from now, in tens) and time to live."""
    out: dict[str, Any] = {}
    soon = time.time()
    for key in redis.scan_iter("rq:*"):
        name = key.decode()
        if side not in name and worker not in name:
            continue
        kind = redis.type(key).decode()
        if kind == "hash":
            value: Any = {f.decode(): _masked(v, side) for f, v in redis.hgetall(key).items()}
        elif kind == "zset":
            value = sorted((_masked(m, side), s if s == float("inf") else round((s - soon) / 10))
                           for m, s in redis.zrange(key, 0, -1, withscores=True))
        elif kind == "stream":
            value = [{f.decode(): _masked(v, side, f) for f, v in fields.items()} for _, fields in redis.xrange(key)]
        elif kind == "set":
            value = sorted(_masked(m, side) for m in redis.smembers(key))
        else:
            value = [_masked(m, side) for m in redis.lrange(key, 0, -1)]
        ttl = redis.ttl(key)
        out[_masked(name.replace(worker, "<worker>"), side)] = (kind, value, ttl if ttl < 0 else round(ttl / 10))
    return out


def _differing(a: dict[str, Any], b: dict[str, Any]) -> list[Any]:
    """What differs between two ``_rq_state``s: each key's entries, a hash's fields only."""
    out: list[Any] = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x != y and x is not None and y is not None and x[0] == y[0] == "hash":
            fields = {f: (x[1].get(f), y[1].get(f)) for f in set(x[1]) | set(y[1]) if x[1].get(f) != y[1].get(f)}
            out.append((key, fields, x[2], y[2]))
        elif x != y:
            out.append((key, x, y))
    return out


def test_a_batchs_start_and_finish_write_what_rqs_own_methods_write_for_each_job(redis: Redis,
                                                                                registry: Registry) -> None:
    """The ledger (``rq_seam.ledger``) against RQ's own methods, job by job: after the start and
    after the finish, every RQ key either side wrote (the worker's too), its type, every field,
    member, stream entry and score, and its time to live, ids and times masked. One job of each
    side is kept for ever (result TTL -1): in a batch, RQ's own methods finish it."""
    registry.append(registry.create("src"), TURN)
    sides = {}
    for side in ("alone", "batch"):
        client = Client(redis, Settings(queue=f"q-{side}"))
        ids = _submit(client, 3, side)
        redis.hset(f"rq:job:{ids[0]}", "result_ttl", -1)  # kept for ever: RQ's own methods write it, in a batch too
        worker = _worker(redis, registry, 8, f"q-{side}")
        queue = worker.queues[0]
        taken = worker.take(8)
        loaded = [DequeuedJob.loaded(raw.decode(), data, redis, worker.serializer) for raw, data in taken.entries]
        sides[side] = (worker, queue, loaded)
    alone, queue, alone_jobs = sides["alone"]
    executions = []
    for job in alone_jobs:  # RQ's own methods, a job at a time, as RQ's worker runs them
        pipe = redis.pipeline(transaction=True)
        executions.append(Execution.create(job, alone.get_heartbeat_ttl(job), pipeline=pipe, worker_name=alone.name))
        job.prepare_for_execution(alone.name, pipeline=pipe)
        pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        alone._busy(job, pipe)
        pipe.execute()
    batch, batch_queue, batch_jobs = sides["batch"]
    start = Started(batch, batch_jobs, batch_queue)
    start.ensure()
    started = _rq_state(redis, "batch", batch.name)
    assert started == _rq_state(redis, "alone", alone.name), _differing(started, _rq_state(redis, "alone", alone.name))
    results = [f'{{"requestId": "{job.id}"}}' for job in alone_jobs]
    pipe = redis.pipeline(transaction=True)
    for job, result, execution in zip(alone_jobs, results, executions, strict=True):
        alone._finish_job(job, result, pipe, execution)  # RQ's own methods (``_handle_success``, ``cleanup_execution``)
    alone._idle(pipe)
    pipe.execute()
    finish = Finished(batch, start)
    pipe = redis.pipeline(transaction=True)
    finish.add(pipe, [r.replace("alone", "batch") for r in results])
    finish.done(pipe.execute())
    after = _rq_state(redis, "batch", batch.name)
    assert after == _rq_state(redis, "alone", alone.name), _differing(after, _rq_state(redis, "alone", alone.name))
    assert any(key.startswith("rq:results:") for key in after) and "rq:finished:q-<side>" in after
    assert redis.ttl("rq:job:batch-0") == -1 and redis.ttl("rq:job:batch-1") > 0


class EndFailsOnce(Counting):
    """The first batch's end fails unexpectedly (a bug): RQ's finish of its jobs raises as the
    records' transaction is built, so that nothing of the transaction is sent."""

    failed_ends: ClassVar[int]

    def finish(self, jobs: Any, queue: Any, results: Any, executions: Any, pipe: Any, last: bool = True) -> float:
        if len(jobs) > 1 and not EndFailsOnce.failed_ends:
            EndFailsOnce.failed_ends += 1
            raise RuntimeError("the batch's end fails")
        return super().finish(jobs, queue, results, executions, pipe, last)


def test_a_batch_whose_end_fails_runs_each_request_on_its_own_with_one_outcome(redis: Redis,
                                                                              registry: Registry) -> None:
    """docs/performance.md#batches: a batch that fails unexpectedly runs each of its requests on its
    own, as started already (its start was sent): each gets one outcome, one child, its job
    finished, and no job of the batch is left in RQ's started registry (each run on its own cleans
    up the execution the batch's start wrote)."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    ids = _submit(client, 3, "fails")
    EndFailsOnce.failed_ends = 0
    Counting.takes, Counting.alone, Counting.batches = [], [], []
    queue = queue_of(client)
    worker = EndFailsOnce([queue], service=_service(redis, registry), connection=redis, abandoned_after=30)
    assert worker.work(burst=True, logging_level="CRITICAL") is True
    assert EndFailsOnce.failed_ends == 1 and Counting.batches == [ids]  # the batch's end failed
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    for i, request_id in enumerate(ids):
        reply = outcomes.get(request_id)
        assert isinstance(reply, ForkResult) and reply.ok and reply.child.id == f"fails-child-{i}", reply
    assert sorted(e.request for e in outcome_entries(redis)) == sorted(ids)  # one outcome each
    assert registry.children("src") == sorted(f"fails-child-{i}" for i in range(3))
    assert sorted(FinishedJobRegistry(queue=queue).get_job_ids()) == sorted(ids)
    assert StartedJobRegistry(queue=queue).get_job_ids(cleanup=False) == []  # the batch's executions cleaned up
    assert redis.llen(queue.intermediate_queue_key) == 0


def test_a_request_resumed_inside_a_batch_keeps_its_planned_children(redis: Redis, registry: Registry,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A fan-out with generated ids whose first attempt planned its children and made one of them
    before it died, run again inside a batch: the batch creates the children the first attempt
    planned (its claim's), never new ids, and the child made first is one of them (no orphan)."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    resumed = client.submit(client.request("src", count=3, request_id="resumed"))
    other = client.submit(client.request("src", session_id="other-child", request_id="other"))
    payload = queue_of(client).fetch_job(resumed).args[0]
    names = iter(f"planned-{i}" for i in range(3))
    first = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=10_000), reply_channel="sf:replies",
                        limits=Limits(max_fanout=1024), new_id=lambda: next(names))
    step = registry.forks.child_step

    def first_child_only(snap: Any, spec: Any, ids: Any = None) -> Any:
        return step(snap, spec, list(spec.child_ids if ids is None else ids)[:1])

    def dies(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the first attempt dies after its first child, before its record")

    monkeypatch.setattr(registry.forks, "child_step", first_child_only)
    monkeypatch.setattr(first.outcomes, "record_many", dies)
    with pytest.raises(Exception):  # noqa: B017 - where it dies is asserted below: one child made, no outcome
        first.handle(payload, resumed, final_attempt=False)
    monkeypatch.setattr(registry.forks, "child_step", step)
    assert Outcomes(redis, ttl=600, stream_maxlen=10).get(resumed) is None
    assert registry.children("src") == ["planned-0"]  # where the first attempt died
    worker = _worker(redis, registry, Settings().batch)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.batches == [[resumed, other]] and Counting.alone == []  # resumed inside a batch
    reply = Outcomes(redis, ttl=600, stream_maxlen=10).get(resumed)
    assert isinstance(reply, ForkResult) and reply.ok, reply
    assert [h.id for h in reply.sessions or []] == ["planned-0", "planned-1", "planned-2"]
    assert registry.children("src") == ["other-child", "planned-0", "planned-1", "planned-2"]


def test_a_fan_out_that_exactly_fills_what_is_left_of_batch_children_joins_the_batch(
        redis: Redis, registry: Registry) -> None:
    """``SESSIONFORK_BATCH_CHILDREN`` of 8: a fan-out of 3, a fork (1), then a fan-out of 4 (what is
    left: exactly 4) run in one batch; the fork after them starts the next batch."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    a = client.submit(client.request("src", count=3, request_id="fill-a"))
    b = client.submit(client.request("src", session_id="fill-b-child", request_id="fill-b"))
    c = client.submit(client.request("src", count=4, request_id="fill-c"))
    d = client.submit(client.request("src", session_id="fill-d-child", request_id="fill-d"))
    worker = _worker(redis, registry, Settings().batch, batch_children=8)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [4]
    assert Counting.batches == [[a, b, c], [d]] and Counting.alone == []
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    assert [len(getattr(outcomes.get(r), "sessions", None) or []) for r in (a, c)] == [3, 4]
    assert all(getattr(outcomes.get(r), "ok", False) for r in (a, b, c, d))


class PausedDuringTheFirstBatch(Counting):
    """The shard is paused (``ops.pauses``) while the worker ends its first batch: right before that
    batch's records and RQ's finish are sent."""

    def finish(self, jobs: Any, queue: Any, results: Any, executions: Any, pipe: Any, last: bool = True) -> float:
        if len(Counting.batches) == 1:
            pauses.pause(self.connection, "test")
        return super().finish(jobs, queue, results, executions, pipe, last)


def test_a_busy_worker_sees_a_pause_between_batches(redis: Redis, registry: Registry) -> None:
    """A worker that always finds requests waiting (never idle) still sees a pause between two
    takes: the batch's finish reads whether one is in force, and the worker takes nothing after
    it (in burst mode it stops; a worker in service waits, as an idle one does:
    tests/worker/test_worker_pause.py)."""
    registry.append(registry.create("src"), TURN)
    client = Client(redis)
    batch = Settings().batch
    ids = _submit(client, batch + 8, "busy")
    Counting.takes, Counting.alone, Counting.batches = [], [], []
    worker = PausedDuringTheFirstBatch([queue_of(client)], service=_service(redis, registry), connection=redis,
                                       abandoned_after=30)
    assert worker.work(burst=True, logging_level="WARNING") is True
    assert Counting.takes == [batch]  # the first take; the pause held before a second
    outcomes = Outcomes(redis, ttl=600, stream_maxlen=10)
    assert [outcomes.get(r) is not None for r in ids] == [True] * batch + [False] * 8
    assert queue_of(client).job_ids == ids[batch:]
    pauses.resume(redis, "test")
