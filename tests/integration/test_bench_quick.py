"""A tiny run of the benchmark, so it cannot rot (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import main as bench


@pytest.mark.slow
def test_quick_benchmark_prints_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| figure | sessionfork | baseline |")
    assert "RQ SimpleWorker no-op jobs/s" in table and "RQ Worker no-op jobs/s" in table
    figures = json.loads((tmp_path / "bench.json").read_text())["figures"]
    assert all(f["value"] > 0 for f in figures)
    names = {f["figure"] for f in figures}
    assert {"single-fork requests/s (1 worker)", "fan-out children/s (64 per request)"} <= names
    boundary = {f"boundary fork at {p} of a 2000-event parent, {what}"
                for p in ("10%", "50%", "100%") for what in ("µs", "Redis bytes/child")}
    assert boundary <= names
