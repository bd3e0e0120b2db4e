"""``python -m bench.profile`` runs and writes its tables: where a fork's worker CPU
goes, in µs per fork. A tiny run in a process of its own (the worker command it profiles sets up
logging and signal handlers); no figure is asserted but that each is measured."""

from __future__ import annotations

import pstats
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_profile_writes_the_worker_cpu_per_fork_and_its_top_functions(tmp_path: Path) -> None:
    out, raw = tmp_path / "profile.md", tmp_path / "profile.pstats"
    subprocess.run([sys.executable, "-m", "bench.profile", "--jobs", "10", "--top", "5", "--out", str(out),
                    "--stats", str(raw)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    report = out.read_text()
    per_fork = re.match(r"Worker CPU per fork: ([\d,]+) µs \(getrusage over 10 forks", report)
    assert per_fork and int(per_fork[1].replace(",", "")) > 0, report[:300]
    for heading in ("| own CPU by package |", "| by cumulative CPU: function |", "| by own CPU: function |",
                    "| by cumulative CPU: sessionfork's functions |"):
        assert report.count(heading) == 1, heading
    assert "\n| sessionfork | " in report  # the package table's row
    own = report.split("sessionfork's functions |")[1].strip().splitlines()[2:]
    assert len(own) == 5 and all(row.startswith("| `sessionfork/") for row in own), own
    assert any("handle" in name for _, _, name in pstats.Stats(str(raw)).stats)  # type: ignore[attr-defined]
