"""The benchmark's RQ-facing runs, tiny (no timing is asserted): the queue-only run with RQ's own
workers as the peer, and the sharded queue's, on each supported RQ (marked ``rq``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rq
from bench import main as bench
from bench.shards import sharded_forks

from sessionfork.embedded import EmbeddedServer

pytestmark = [pytest.mark.rq]


@pytest.mark.slow
def test_the_shard_bench_runs_every_fork_on_the_shard_list_it_is_given() -> None:
    """One queue server takes every outcome; two share them (the same 2 worker processes in both)."""
    with EmbeddedServer() as registry, EmbeddedServer() as a, EmbeddedServer() as b:
        one = sharded_forks(registry, [a], 30)
        two = sharded_forks(registry, [a, b], 30)
    warm = 2  # per shard, before the timed requests
    assert one.outcomes == [30 + warm] and one.rate > 0 and one.cores > 0
    assert sum(two.outcomes) == 30 + 2 * warm and min(two.outcomes) > warm, two.outcomes
    assert two.rate > 0 and two.cores > 0


@pytest.mark.slow
def test_queue_only_run_reports_the_rq_figures_with_the_rq_version(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--queue-only", "--out", str(tmp_path)]) == 0
    assert f"RQ {rq.__version__}" in capsys.readouterr().out
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["rq"] == rq.__version__
    assert {f["figure"] for f in result["figures"]} == {
        "single-fork requests/s (1 worker, median of rounds)",
        "Redis round trips per job, worker side (batches, the default)",
        "Redis round trips per job, worker side, one at a time (SESSIONFORK_BATCH=1)"}
