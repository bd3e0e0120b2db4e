"""A tiny run of the bundles benchmark, so it cannot rot (no timing is asserted: its figures are
not measurements)."""

from __future__ import annotations

import json

import pytest
from bench import bundles


def test_the_bundles_bench_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    bundles.main(["--sessions", "4", "--events", "400"])
    figures = json.loads(capsys.readouterr().out)
    assert (figures["sessions"], figures["events"]) == (4, 400)
    assert figures["bundleBytes"] > 400 * 50
    for name in ("exportEventsPerS", "importEventsPerS", "exportPeakBytes", "importPeakBytes"):
        assert figures[name] > 0, name
