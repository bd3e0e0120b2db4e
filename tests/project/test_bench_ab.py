"""bench.ab's report: medians of alternating rounds, new ÷ old, and each tree's fan-out ÷ single."""

from __future__ import annotations

from bench import ab


def test_the_ab_report_gives_medians_and_ratios() -> None:
    old = [{"fanout": 6400.0, "single": 320.0}, {"fanout": 6000.0, "single": 300.0},
           {"fanout": 7000.0, "single": 310.0}]
    new = [{"fanout": 8000.0, "single": 330.0}, {"fanout": 7000.0, "single": 300.0},
           {"fanout": 9000.0, "single": 320.0}]
    lines = ab.report(("old", "new"), list(zip(old, new, strict=True)))
    assert lines[2] == "| 1 | 6,400 | 8,000 | 320.0 | 330.0 |"
    assert "fan-out children/s (64 per request), median of 3: old 6,400.0, new 8,000.0, new ÷ old 1.25x" in lines
    assert "single-fork requests/s (1 worker), median of 3: old 310.0, new 320.0, new ÷ old 1.03x" in lines
    assert "fan-out children/s ÷ single-fork requests/s, old: 20.6x" in lines
    assert "fan-out children/s ÷ single-fork requests/s, new: 25.0x" in lines
