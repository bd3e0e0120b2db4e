"""``rq_seam.ledger``: a batch's RQ bookkeeping writes each registry the jobs share once (the
started and finished registries, the worker's executions), and per job only what RQ writes per
job, each in one script call. That every key, field, score and time to live is RQ's own is
``test_batches.py::test_a_batchs_start_and_finish_write_what_rqs_own_methods_write_for_each_job``."""

from __future__ import annotations

from collections import Counter

import pytest
from monitoring import monitored
from redis import Redis
from rq import Queue

from sessionfork.core import lua
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.rq_seam.worker import RQ_MAJOR, SeamWorker

pytestmark = pytest.mark.rq  # RQ's layout: on RQ 2.12 too


@pytest.mark.parametrize("jobs", [1, 5])
def test_a_batch_writes_each_shared_registry_once_and_per_job_what_rq_writes_per_job(
        server: EmbeddedServer, redis: Redis, jobs: int) -> None:
    queue = Queue("ledger", connection=redis)
    batch = [queue.enqueue("bench.measure.noop", job_id=f"ledger-{i}") for i in range(jobs)]
    worker = SeamWorker([queue], connection=redis, batch=32)
    ledger = worker._ledger(queue)
    started, executions = ledger.start(batch, 30)
    finished = ledger.finish(batch, ["{}"] * jobs, executions, 600)
    for script, _, _ in (started, finished):
        redis.script_load(script.script)  # no NOSCRIPT re-run below
    with monitored(server) as seen:
        assert lua.run(redis, [started, finished]) == [jobs, jobs]
    calls = [c for c in seen if c.client != "lua" and c.name in {"EVALSHA", "EVAL"}]
    ran = [c for c in seen if c.client == "lua"]
    assert len(calls) == 2  # one script call each, whatever the batch's size
    written = Counter((c.name, c.args[1]) for c in ran)
    for shared in (("ZADD", queue.started_job_registry.key), ("ZREM", queue.started_job_registry.key),
                   ("ZADD", queue.finished_job_registry.key)):
        assert written[shared] == 1, shared
    assert written[("LREM", queue.intermediate_queue_key)] == jobs  # one per entry, as RQ's start removes it
    # Per job: its execution's hash and index (each with its TTL), its hash at start and at the
    # finish, the intermediate queue's entry, its result (with its TTL) and its hash's TTL, its
    # execution gone: 12. Per batch: the registries above, and RQ 3's worker executions (SADD,
    # EXPIRE, SREM) where RQ 2 clears the worker's current job (HDEL).
    assert len(ran) == 12 * jobs + (6 if RQ_MAJOR >= 3 else 4)
