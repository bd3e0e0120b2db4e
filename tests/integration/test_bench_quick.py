"""A tiny run of the benchmark, so it cannot rot (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rq
from bench import main as bench


@pytest.mark.slow
def test_quick_benchmark_prints_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert table.startswith(f"\nRQ {rq.__version__}\n\n| figure | sessionfork | baseline |")
    assert "RQ SimpleWorker no-op jobs/s" in table and "RQ Worker no-op jobs/s" in table
    figures = json.loads((tmp_path / "bench.json").read_text())["figures"]
    addon = "Redis CPU µs a waiting sync scheduler adds per fork"  # a difference: noise may make it negative
    assert all(f["value"] > 0 for f in figures if f["figure"] != addon)
    names = {f["figure"] for f in figures}
    assert {addon, "Redis CPU µs per fork, worker side (queue + registry, median of rounds)",
            "forks/s one primary carries at 100 % of a core (waiting schedulers)",
            "queue primaries (shards) for 1,000,000 forks/s at 100 % of a core",
            "Redis bytes retained per completed request, hash-max-listpack-value 512",
            "GB a steady 1000 forks/s holds (default TTL 24 h)"} <= names
    assert {"single-fork requests/s (1 worker, median of rounds)", "fan-out children/s (64 per request)"} <= names
    assert "async forks/s, 100 concurrent, 4 workers" in names
    boundary = {f"boundary fork at {p} of a 2000-event parent, {what}"
                for p in ("10%", "50%", "100%") for what in ("µs", "Redis bytes/child")}
    assert boundary <= names
    assert {"fork with 2 edits µs, 10-event parent", "Redis bytes/child with 2 edits, less the edits' own bytes",
            "variant fan-out children/s (64 variants, one edit each)",
            "bytes a deleted 2000-event parent's log holds, summary child keeping the last turn"} <= names


@pytest.mark.slow
def test_queue_only_run_reports_the_rq_figures_with_the_rq_version(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--queue-only", "--out", str(tmp_path)]) == 0
    assert f"RQ {rq.__version__}" in capsys.readouterr().out
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["rq"] == rq.__version__
    assert {f["figure"] for f in result["figures"]} == {
        "single-fork requests/s (1 worker, median of rounds)", "Redis round trips per job, worker side"}
