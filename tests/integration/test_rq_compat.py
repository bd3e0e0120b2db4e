"""What RQ gives stays: ``rq info`` sees sessionfork's queue and workers, and RQ's registries hold
its jobs, on whichever RQ major is installed (``run.py`` runs this on RQ 3 and on RQ 2.12)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import SETTINGS, make_client, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis
from rq.registry import FinishedJobRegistry

from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.queue import jobs

RQ = str(Path(sys.executable).parent / "rq")


def test_rq_info_lists_the_fork_queue_and_a_working_sessionfork_worker(server: EmbeddedServer, redis: Redis) -> None:
    name = worker_name("info")
    proc = start_worker(server.url, name)
    try:
        wait_registered(redis, name)
        registry = Registry(redis)
        registry.append(registry.create("info-src"), turn(1))
        client = make_client(redis)
        request = client.request("info-src", session_id="info-child")
        client.submit(request)
        assert client.wait(request, 20).ok
        out = subprocess.run([RQ, "info", "--url", server.url, "--serializer", "sessionfork.jobs.JSONSerializer",
                              "--by-queue", SETTINGS.queue], capture_output=True, text=True, timeout=60)
    finally:
        assert stop(proc) == 0
    assert out.returncode == 0, out.stderr
    assert SETTINGS.queue in out.stdout
    assert name in out.stdout
    finished = FinishedJobRegistry(queue=jobs.make_queue(redis, SETTINGS))
    assert request.request_id in finished.get_job_ids()
