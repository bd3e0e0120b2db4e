"""A tiny run of the benchmark, so it cannot rot (no timing is asserted: its figures are not
measurements, so it runs in the parallel phase). Its RQ-facing runs are ``test_bench_rq.py``'s,
which run again on RQ 2.12."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest
from bench import ab, merges, peers
from bench import main as bench

SHARD_ROWS = {"forks/s, 2 queue shards (2 worker processes in all, median of rounds)",
              "CPU cores busy, 1 queue shard (workers + Redis servers + client)",
              "CPU cores busy, 2 queue shards (workers + Redis servers + client)"}


@pytest.mark.slow
def test_quick_benchmark_prints_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert table.startswith(f"\nRQ {version('rq')}\n\n| figure | sessionfork | baseline |")
    assert "RQ SimpleWorker no-op jobs/s" in table and "RQ Worker no-op jobs/s" in table
    figures = json.loads((tmp_path / "bench.json").read_text())["figures"]
    addon = "Redis CPU µs a waiting sync scheduler adds per fork"  # differences: noise may make them negative
    rq_share = "Redis CPU µs per fork job spent on RQ's job bookkeeping (one at a time, less own steps)"
    not_positive = [(f["figure"], f["value"]) for f in figures if f["figure"] not in (addon, rq_share)
                    and f["value"] <= 0]
    assert not not_positive, not_positive  # named: a quick run's differences are small
    names = {f["figure"] for f in figures}
    batched = "Redis CPU µs per fork, worker side (queue + registry, batches, the default, median of rounds)"
    one_at_a_time = "Redis CPU µs per fork, worker side, one at a time (SESSIONFORK_BATCH=1, median of rounds)"
    value = {f["figure"]: f["value"] for f in figures}
    # The two worker-side rows measure two workers: a backlog taken in batches costs less per fork.
    assert value[batched] < value[one_at_a_time]
    trips = "Redis round trips per job, worker side"
    assert value[f"{trips} (batches, the default)"] < value[f"{trips}, one at a time (SESSIONFORK_BATCH=1)"]
    assert {addon, rq_share, batched, one_at_a_time,
            "Redis CPU µs per fork, sessionfork's own steps (no RQ job: claim, source, child, record)",
            "forks/s one primary carries at 100 % of a core (queue and registry on it, waiting schedulers)",
            "forks/s one queue primary carries at 100 % of a core (waiting schedulers, registry apart)",
            "Redis CPU µs per fork on the registry (its own server)",
            "queue primaries (shards) for 1,000,000 forks/s, registry apart",
            "registry cores (cluster masters) beside them for 1,000,000 forks/s",
            "Redis bytes retained per completed request",
            "GB a steady 1000 forks/s holds (default TTL 24 h)"} <= names
    assert {"single-fork requests/s (1 worker, median of rounds)", bench.FAN_OUT} <= names
    fan_rows = [f for f in figures if f["figure"] == bench.FAN_OUT]  # against the target and single forks
    assert [f["baseline"] for f in fan_rows] == ["target children/s",
                                                 "single-fork requests/s (1 worker, median of rounds)"]
    assert fan_rows[1]["baselineValue"] == next(f["value"] for f in figures if f["figure"].startswith("single-fork"))
    assert "async forks/s, 100 concurrent, 4 workers" in names
    assert names >= SHARD_ROWS
    shards = next(f for f in figures if f["figure"].startswith("forks/s, 2 queue shards"))
    assert shards["baseline"] == "forks/s, 1 queue shard (2 worker processes)" and shards["ratio"] > 0
    boundary = {f"boundary fork at {p} of a 2000-event parent, {what}"
                for p in ("10%", "50%", "100%") for what in ("µs", "Redis bytes/child")}
    assert boundary <= names
    # The peers per worker process, measured in the same run (never skipped).
    per_process = {(f["figure"], f["baseline"]): f for f in figures if f["figure"] in {r[1] for r in peers.ROW_FIGURES}}
    assert set(per_process) == {(figure, f"{peers.LABELS[peer]} {unit}") for _, figure, unit in peers.ROW_FIGURES
                                for peer in ("sessionfork-1", "dramatiq", "huey", "rq")}
    assert all(f["value"] > 0 and f["baselineValue"] > 0 for f in per_process.values())
    systems = json.loads((tmp_path / "bench.json").read_text())["perProcess"]["systems"]
    assert set(systems) == {"sessionfork", "sessionfork-1", "rq", "dramatiq", "huey"}
    assert all(s["jobs"] == 30 and s["per_s"] > 0 and s["commands"] > 0 and s["worker_cpu_us"] > 0
               for s in systems.values())
    assert "| Dramatiq no-op (8 threads) |" in table and "| Huey no-op (8 threads, no results) |" in table
    assert {"fork with 2 edits µs, 10-event parent", "Redis bytes/child with 2 edits, less the edits' own bytes",
            "variant fan-out children/s (64 variants, one edit each, median of rounds)",
            "bytes a deleted 2000-event parent's log holds, summary child keeping the last turn"} <= names
    # Merges and selects: each against its baseline of the same run; the targets are the full run's.
    merge_rows = {(f["figure"], f["baseline"], f["bar"]) for f in figures}
    fork = merges.fork_row()
    assert {(fork, fork, ""), (merges.summary_row(merges.QUICK.big), fork, "≤ 1.5"), (merges.EVENTS_ROW, fork, "≤ 3"),
            (merges.FAN_ROW, fork, ""), (merges.SELECT_ROW, merges.FAN_ROW, "≤ 2"),
            (merges.SUMMARY_BYTES_ROW, "limit bytes", "≤ 1"), (merges.EVENTS_BYTES_ROW, "limit bytes", "≤ 1"),
            (merges.EVENTS_JSON_ROW, "limit bytes", "")} <= merge_rows


@pytest.mark.slow
def test_the_ab_bench_measures_both_trees_in_alternating_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench.ab`` against HEAD's tree (extracted): a round measures it, then this tree (one round:
    each measurement starts workers of its own; ``run_tree`` checks which tree each one imported)."""
    assert ab.main(["HEAD", "--rounds", "1", "--fan-requests", "2", "--singles", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("| 1 |")]
    assert len(rows) == 1 and all(float(cell.replace(",", "")) > 0 for cell in rows[0].strip("|").split("|"))
    assert any(line.startswith("fan-out children/s (64 per request), median of 1: HEAD ") for line in out)
    assert sum(line.startswith("fan-out children/s ÷ single-fork requests/s, ") for line in out) == 2

