"""What RQ gives stays: ``rq info`` sees sessionfork's queue and workers, and RQ's registries hold
its jobs, on whichever RQ major is installed (``run.py`` runs this on RQ 3 and on RQ 2.12)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import SETTINGS, make_client, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis
from rq import SimpleWorker, Worker
from rq.registry import FinishedJobRegistry
from waits import wait_until

from sessionfork.clients.client import Client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkRequest
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs, rq_seam
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.rq_seam import worker as seam_worker
from sessionfork.worker.service import RequestService

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

RQ = str(Path(sys.executable).parent / "rq")


def test_every_override_of_rqs_worker_is_the_seams_and_named_in_its_docstring() -> None:
    """On the installed RQ: the methods of RQ's worker that sessionfork changes are all
    ``SeamWorker``'s, each named in the seam's docstring; ``RequestWorker`` fills the seam's hooks
    and overrides no RQ method but its constructor (tests/project/test_layering.py: no other
    worker class)."""
    rq_names = set(dir(SimpleWorker))
    methods = {name for name, value in vars(RequestWorker).items() if callable(value) or isinstance(value, property)}
    assert methods & rq_names == {"__init__"}
    overrides = {name for name in vars(seam_worker.SeamWorker) if name in rq_names and not name.startswith("__")}
    assert {"dequeue_job_and_maintain_ttl", "execute_job", "heartbeat", "teardown"} <= overrides
    assert {name for name in overrides if f"``{name}``" not in (rq_seam.__doc__ or "")} == set()


def _submitted(redis: Redis, label: str, n: int) -> tuple[Client, list[ForkRequest]]:
    """A source ``<label>-src`` with one turn and ``n`` single-fork requests of it submitted."""
    registry = Registry(redis)
    registry.append(registry.create(f"{label}-src"), turn(1))
    client = make_client(redis)
    requests = [client.request(f"{label}-src", session_id=f"{label}-{i}") for i in range(n)]
    for request in requests:
        client.submit(request)
    return client, requests


@contextmanager
def _forked_through_a_worker(server: EmbeddedServer, redis: Redis, label: str,
                             n: int) -> Iterator[tuple[str, list[ForkRequest]]]:
    """A worker process started and registered, ``n`` requests forked through it (each answered
    OK); yields the worker's name and the requests, then stops the worker (it must exit 0)."""
    name = worker_name(label)
    proc = start_worker(server.url, name)
    try:
        wait_registered(redis, name)
        client, requests = _submitted(redis, label, n)
        assert all(client.wait(request, 20).ok for request in requests)
        yield name, requests
    finally:
        assert stop(proc) == 0


def test_rq_info_lists_the_fork_queue_and_a_working_sessionfork_worker(server: EmbeddedServer, redis: Redis) -> None:
    with _forked_through_a_worker(server, redis, "info", 1) as (name, [request]):
        out = subprocess.run([RQ, "info", "--url", server.url, "--serializer", "sessionfork.jobs.JSONSerializer",
                              "--by-queue", SETTINGS.queue], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert SETTINGS.queue in out.stdout
    assert name in out.stdout
    finished = FinishedJobRegistry(queue=jobs.make_queue(redis, SETTINGS))
    assert request.request_id in finished.get_job_ids()


def test_rq_worker_counters_count_every_job_sent_with_the_beat(server: EmbeddedServer, redis: Redis) -> None:
    """RQ's ``successful_job_count`` and ``total_working_time`` (``rq info``, rq-dashboard) count every
    job: batched into the worker's once-a-second beat, not sent with each job."""
    with _forked_through_a_worker(server, redis, "counts", 3) as (name, _):

        def counted() -> bool:  # the beat of the idle worker sends them, within a second or two
            worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + name, connection=redis)
            return worker is not None and worker.successful_job_count == 3

        wait_until(counted, 10, "the worker's counters to reach 3 jobs")


def test_rq_worker_counters_of_the_last_jobs_are_sent_at_stop(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that stops sends the counters of its jobs since its last beat (here: its only beat
    was before its first job) before it unregisters."""
    monkeypatch.setattr(seam_worker, "_HEARTBEAT_EVERY", 3600.0)
    _submitted(redis, "burst", 3)
    service = RequestService(Registry(redis), Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies")
    worker = RequestWorker([jobs.make_queue(redis, SETTINGS)], service=service, connection=redis, abandoned_after=30)
    assert worker.work(burst=True, logging_level="WARNING", max_idle_time=5) is True
    assert redis.hget(worker.key, "successful_job_count") == b"3"
    assert float(redis.hget(worker.key, "total_working_time") or 0) > 0
