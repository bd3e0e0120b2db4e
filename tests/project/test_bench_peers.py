"""The peers' per-process drains (bench.peers) count a run only when every job was
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
def test_a_job_not_done_in_redis_fails_the_drain_though_its_framework_counted_it(server: EmbeddedServer,
                                                                               system: str) -> None:
    redis = flushed(server)
    peer_runner.prepare(system, server.url, 3)  # 3 jobs queued, the worker built but never started
    with pytest.raises(RuntimeError, match=r"3 of 3 fork requests without an OK outcome|RQ: 0 of 3 jobs finished"
                                           r"|3 jobs reported done, 3 pending"):
        peers.verify(system, redis, 3, 3)


def test_a_drain_its_framework_counted_short_fails_though_nothing_is_pending(server: EmbeddedServer) -> None:
    with pytest.raises(RuntimeError, match="huey: 2 of 3 jobs reported done"):
        peers.verify("huey", flushed(server), 3, 2)


def test_done_reports_once_at_the_last_job_or_at_close() -> None:
    said: list[str] = []
    done = peer_runner.Done(2, said.append)
    done.start()
    done.add()
    assert not said
    done.add()
    done.add()  # a third (a retry) changes nothing reported
    done.close()
    assert len(said) == 1 and said[0].startswith("done ") and said[0].endswith(" 2")
    short = peer_runner.Done(2, said.append)
    short.close()
    assert said[1].endswith(" 0") and short.reached.is_set()
