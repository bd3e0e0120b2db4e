"""The peers' per-process drains (bench.peers, issue 31 #5) count a run only when every job was
done: a job left queued fails the run. In-process (no worker starts), so quick; the quick benchmark
(test_bench_quick.py) drains each system for real and checks the rows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bench import peer_runner, peers
from bench.measure import flushed

from sessionfork.embedded import EmbeddedServer

pytestmark = [pytest.mark.rq]


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as s:
        yield s


@pytest.mark.parametrize("system", peer_runner.SYSTEMS)
def test_a_job_not_done_fails_the_drain(server: EmbeddedServer, system: str) -> None:
    redis = flushed(server)
    peer_runner.prepare(system, server.url, 3)  # 3 jobs queued, the worker built but never started
    with pytest.raises(RuntimeError, match=r"(?i)3 (of 3 )?fork requests without an OK outcome|0 of 3"):
        peers.verify(system, redis, 3, 0 if system in {"dramatiq", "huey"} else -1)


@pytest.mark.parametrize("system", ["dramatiq", "huey"])
def test_a_threaded_peer_counted_done_still_fails_with_a_job_pending(server: EmbeddedServer, system: str) -> None:
    redis = flushed(server)
    peer_runner.prepare(system, server.url, 3)
    with pytest.raises(RuntimeError, match="3 of 3 jobs reported done, 3 pending"):
        peers.verify(system, redis, 3, 3)
