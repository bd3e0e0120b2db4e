"""A worker SIGKILLed at each step of a batch: every request of the batch is recovered by the next
worker and ends with exactly one outcome and its children, once (each kill test first asserts where
the kill landed, from what it left in Redis); SIGTERM finishes the batch in hand and takes no other.
The batch's first request is a fan-out of 3 (it fits in ``SESSIONFORK_BATCH_CHILDREN``), the others
one-child forks."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fault_fixtures import missing_outcomes, stranded_jobs, wait_all_outcomes
from helpers import SETTINGS, clean_environ, make_client, outcome_entries, start_worker, turn, worker_name
from redis import Redis
from rq.registry import FinishedJobRegistry, StartedJobRegistry
from waits import exited, wait_until

from sessionfork.core import keys
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

pytestmark = [pytest.mark.slow, pytest.mark.rq]

KILLER = Path(__file__).parent.parent / "data" / "batch_killer.py"
N = 6


FAN = [f"k-fan-{j}" for j in range(3)]
"""The children of the batch's first request, a fan-out."""
SINGLES = [f"k-child-{i}" for i in range(1, N)]
"""The children of its other requests, one each."""


def _batch(rds: Redis) -> list[str]:
    """A fan-out of 3 then ``N - 1`` one-child forks of one source, queued before any worker runs:
    one batch."""
    registry = Registry(rds)
    registry.append(registry.create("src"), turn(1))
    client = make_client(rds)
    return [client.submit(client.request("src", session_ids=FAN, request_id="k-0")),
            *(client.submit(client.request("src", session_id=f"k-child-{i}", request_id=f"k-{i}"))
              for i in range(1, N))]


def _children(rds: Redis) -> list[str]:
    return Registry(rds).children("src")


def _kill_at(step: str, server: EmbeddedServer, procs: list[subprocess.Popen[bytes]], **env: Any) -> None:
    """A worker (``batch_killer.py``) run on the queued batch until it SIGKILLs itself at ``step``."""
    killed = subprocess.Popen([sys.executable, str(KILLER), step, "--redis-url", server.url, "worker",
                               "--name", worker_name("killed"), "--log-level", "WARNING"],
                              env=clean_environ(SESSIONFORK_BATCH=N, **env), stdin=subprocess.DEVNULL)
    procs.append(killed)
    assert exited(killed, 30) == -signal.SIGKILL


def _recovered(server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]], ids: list[str]) -> None:
    """The next worker recovers the killed worker's requests: each ends with one outcome, announced
    once, and its children, none more; RQ's registries settle."""
    procs.append(start_worker(server.url, worker_name("next")))
    wait_all_outcomes(rds, ids)
    fan = make_client(rds).wait(ids[0], timeout=5)
    assert isinstance(fan, ForkResult) and fan.ok and [h.id for h in fan.sessions or []] == FAN, fan
    for i, request_id in enumerate(ids[1:], start=1):
        reply = make_client(rds).wait(request_id, timeout=5)
        assert isinstance(reply, ForkResult) and reply.child.id == f"k-child-{i}", reply
    assert sorted(e.request for e in outcome_entries(rds)) == sorted(ids)  # announced exactly once each
    assert _children(rds) == sorted(FAN + SINGLES)  # each request's children, none more
    queue = jobs.make_queue(rds, SETTINGS)
    wait_until(lambda: StartedJobRegistry(queue=queue).get_job_ids() == [] and stranded_jobs(rds) == [], 30,
               "RQ's registries to settle")


@pytest.mark.parametrize("step", ["taken", "started", "created", "recording"])
def test_a_worker_killed_at_a_step_of_a_batch_leaves_every_request_one_outcome(
        step: str, own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    ids = _batch(rds)
    _kill_at(step, own_server, procs)
    queue = jobs.make_queue(rds, SETTINGS)
    started = sorted(StartedJobRegistry(queue=queue).get_job_ids(cleanup=False))
    # Where the kill landed: nothing answered, and each step's own trace.
    assert missing_outcomes(rds, ids) == ids and queue.count == 0
    if step == "taken":
        assert stranded_jobs(rds) == ids and started == [] and _children(rds) == []
    else:
        assert started == sorted(ids) and all(rds.hexists(keys.request(i), "digest") for i in ids)
        assert _children(rds) == {"started": [], "created": FAN, "recording": sorted(FAN + SINGLES)}[step]
        # a fan-out keeps its snapshot before its first child exists (a retry makes the rest from it)
        assert rds.hexists(keys.request("k-0"), "snapshot") == (step != "started")

    _recovered(own_server, rds, procs, ids)


def test_a_worker_killed_with_two_batches_in_flight_leaves_every_request_one_outcome(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    """Batches overlap: killed when the take's second batch has begun (its requests claimed, its
    child steps sent) and the first has not ended (no outcome stored, no RQ finish): every request
    of both ends with one outcome, announced once, and its children, none more."""
    ids = _batch(rds)
    _kill_at("overlapped", own_server, procs, SESSIONFORK_BATCH_CHILDREN=3)
    queue = jobs.make_queue(rds, SETTINGS)
    # Where the kill landed: the fan-out's batch (3 children) and the next (3 singles) begun, both
    # claimed and started in RQ, the first's children made, nothing answered nor finished.
    second = ids[1:4]
    assert missing_outcomes(rds, ids) == ids and queue.count == 0
    assert [rds.hexists(keys.request(i), "digest") for i in ids] == [True] * 4 + [False] * (N - 4)
    started = sorted(StartedJobRegistry(queue=queue).get_job_ids(cleanup=False))
    assert started == sorted([ids[0], *second]) and FinishedJobRegistry(queue=queue).get_job_ids() == []
    assert set(FAN) <= set(_children(rds)) <= set(FAN + SINGLES[:3])

    _recovered(own_server, rds, procs, ids)


def test_sigterm_finishes_the_batch_in_hand_and_takes_no_other(
        own_server: EmbeddedServer, rds: Redis, procs: list[subprocess.Popen[bytes]]) -> None:
    registry = Registry(rds)
    registry.append(registry.create("src"), turn(1))
    client = make_client(rds, max_fanout=1024)
    first = [client.submit(client.request("src", count=1024, request_id="t-big"))]
    first += [client.submit(client.request("src", request_id=f"t-{i}")) for i in range(N - 1)]
    rest = [client.submit(client.request("src", request_id=f"u-{i}")) for i in range(N)]
    proc = start_worker(own_server.url, worker_name("term"), SESSIONFORK_BATCH=N, SESSIONFORK_MAX_FANOUT=1024)
    procs.append(proc)
    # The batch's singles are answered first; the fan-out runs after them, alone: stop it there.
    wait_until(lambda: missing_outcomes(rds, first[1:]) == [], 30, "the batch's single forks")
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, 30) == 0
    assert missing_outcomes(rds, first) == []  # the whole batch in hand, its fan-out too
    assert missing_outcomes(rds, rest) == rest and jobs.make_queue(rds, SETTINGS).job_ids == rest  # no other
    assert stranded_jobs(rds) == []
