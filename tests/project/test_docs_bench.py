"""The Performance page's tables are generated from docs/data/bench.json, never typed by hand."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest
from bench import publish

ROOT = Path(__file__).resolve().parents[2]


def snapshot() -> dict[str, object]:
    return json.loads(publish.SNAPSHOT.read_text())  # type: ignore[no-any-return]


def test_the_page_is_what_the_generator_makes_of_the_snapshot() -> None:
    page = publish.PAGE.read_text()
    assert page.count(publish.BEGIN) == 1 and page.count(publish.END) == 1
    assert publish.page_with(page, snapshot()) == page


def test_every_figure_of_every_run_is_a_row_of_the_page() -> None:
    page = publish.PAGE.read_text()
    runs = snapshot()["runs"]
    assert [run["rq"] for run in runs] == ["3.0.0", "2.12.0"]  # type: ignore[index]
    for run in runs:  # type: ignore[attr-defined]
        assert f"on RQ {run['rq']}:" in page
        for figure in run["figures"]:
            assert f"| {figure['figure']} | {figure['value']:,.1f} |" in page


def test_the_table_formats_values_ratios_and_bars() -> None:
    rows = publish.table([
        {"figure": "fan-out", "value": 9408.44, "baseline": "target", "baselineValue": 10000.0, "ratio": 0.940844,
         "bar": "≥ 1"},
        {"figure": "p50", "value": 3.5, "baseline": "none", "baselineValue": 0.0, "ratio": None, "bar": ""},
    ])
    assert rows[:2] == publish.HEADER
    assert rows[2:] == ["| fan-out | 9,408.4 | target | 10,000.0 | 0.94 | ≥ 1 |", "| p50 | 3.5 | none | 0.0 |  |  |"]


def test_publishing_a_run_takes_both_rq_passes_and_refuses_a_quick_one(tmp_path: Path) -> None:
    run = {"quick": False, "rq": "3.0.0", "figures": [], "ping_per_s": 1.0}
    (tmp_path / "rq2").mkdir()
    (tmp_path / "bench.json").write_text(json.dumps(run))
    (tmp_path / "rq2" / "bench.json").write_text(json.dumps({**run, "rq": "2.12.0"}))
    snap = publish.snapshot_of(tmp_path, datetime.date(2027, 1, 2))
    assert snap["date"] == "2027-01-02" and [r["rq"] for r in snap["runs"]] == ["3.0.0", "2.12.0"]
    page = publish.page_with(f"intro\n{publish.BEGIN}\nold\n{publish.END}\noutro\n", snap)
    assert page.startswith("intro\n") and page.endswith("\noutro\n") and "old" not in page
    assert "Run of 2027-01-02 (`make bench`), on RQ 3.0.0:" in page
    (tmp_path / "rq2" / "bench.json").write_text(json.dumps({**run, "quick": True}))
    with pytest.raises(SystemExit, match="--quick"):
        publish.snapshot_of(tmp_path, datetime.date(2027, 1, 2))


def test_the_readme_capacity_table_is_what_the_generator_makes_of_the_snapshot() -> None:
    readme = publish.README.read_text()
    assert readme.count(publish.README_BEGIN) == 1 and readme.count(publish.README_END) == 1
    assert publish.readme_with(readme, snapshot()) == readme


def test_the_capacity_table_divides_each_rate_by_one_core_and_multiplies_bytes_by_the_window() -> None:
    figures = [{"figure": publish.QUEUE_RATE, "value": 2000.0, "baselineValue": 5000.0},
               {"figure": publish.REQUEST_BYTES, "value": 1000.0, "baselineValue": 1024.0}]
    table = publish.capacity({"date": "2027-01-02", "runs": [{"figures": figures}]}, ttl=86400).splitlines()
    assert table[1] == "| steady forks/s | queue primaries (cores) | registry cores | Redis memory, 24 h window |"
    assert table[3] == "| 100 | 0.05 | 0.02 | 8.6 GB |"
    assert table[7] == "| 1,000,000 | 500.00 | 200.00 | 86,400.0 GB |"
    assert "one queue primary carries 2,000 forks/s, one registry core 5,000" in table[-2]


# -- the charts, generated from the same snapshot --------------------------------------------------


def test_the_charts_and_their_block_are_what_the_generator_makes_of_the_snapshot() -> None:
    from bench import charts

    page = publish.PAGE.read_text()
    assert page.count(publish.CHARTS_BEGIN) == 1 and page.count(publish.CHARTS_END) == 1
    assert publish.charts_with(page, snapshot()) == page
    made = publish.charts(snapshot())
    assert sorted(made) == sorted(charts.FILES) == sorted(p.name for p in publish.CHARTS.glob("*"))
    for name, svg in made.items():
        assert (publish.CHARTS / name).read_text() == svg, f"docs/charts/{name} is not the snapshot's"
        assert f"](charts/{name})" in page


def test_the_main_claim_comes_first_fork_cost_flat_from_10_to_100000_events() -> None:
    page = publish.PAGE.read_text()
    body = page.split("\n", 2)[2]
    assert body.startswith(publish.CHARTS_BEGIN + "\nA fork costs the same on a 10-event parent and on a 100,000-event")
    assert body.index("charts/fork-time.svg") < body.index(publish.BEGIN)  # before any table


def test_the_fork_chart_plots_each_parent_size_at_its_figure() -> None:
    import xml.etree.ElementTree as ET

    from bench import charts

    runs = snapshot()["runs"]
    figures = {f["figure"]: f["value"] for f in runs[0]["figures"]}  # type: ignore[index]
    values = [figures[charts.FORK_US.format(n)] for n in charts.PARENT_SIZES]
    svg = ET.fromstring(publish.charts(snapshot())["fork-time.svg"])
    ns = "{http://www.w3.org/2000/svg}"
    circles = svg.findall(f"{ns}circle")
    top = charts.nice_top(max(values) * 1.15)
    assert [round(float(c.get("cy", "")), 1) for c in circles] == [round(charts.y_of(v, top), 1) for v in values]
    assert [c.findtext(f"{ns}title") for c in circles] == [
        f"{n:,} events: {charts.number(v)} µs per fork" for n, v in zip(charts.PARENT_SIZES, values, strict=True)]
    assert max(values) <= 1.5 * min(values)  # the claim the chart makes: flat


def test_the_chart_scale_starts_at_zero_and_ends_on_a_round_number() -> None:
    from bench import charts

    assert [charts.nice_top(v) for v in (0, 0.7, 1, 1.2, 2.2, 4, 540, 7_000)] == [1, 1, 1, 2, 2.5, 5, 1000, 10_000]
    assert charts.y_of(0, 100) == charts.HEIGHT - charts.BOTTOM and charts.y_of(100, 100) == charts.TOP
    bars = charts.bar_chart("t", "u", [("a", 10.0), ("b", 5.0)])
    assert bars.count("<rect ") == 3 and "<title>a: 10.0 u</title>" in bars  # background + two bars
    assert [charts.number(v) for v in (3.456, 571.36, 13_973_592.0)] == ["3.5", "571", "13,973,592"]


def test_the_headline_figure_is_the_snapshots_in_the_readme_the_page_and_the_chart() -> None:
    """One figure heads the README and the page, the per-process forks/s with requests queued first,
    rounded to the hundred, with its ratio to Dramatiq of the same run; the chart's first bar is it."""
    import xml.etree.ElementTree as ET

    from bench import charts

    rows = {(f["figure"], f["baseline"]): f for f in snapshot()["runs"][0]["figures"]}  # type: ignore[index]
    dramatiq = rows[(charts.QUEUED, "Dramatiq no-op (8 threads) jobs/s")]
    about = f"forks about {round(dramatiq['value'], -2):,.0f} queued requests"
    ratio = f"{dramatiq['ratio']:.2f}\u00d7 a Dramatiq process's no-op jobs"
    readme, page = publish.README.read_text(), publish.PAGE.read_text()
    assert about in readme and ratio in readme
    assert f"One worker process {about}" in page and f"{dramatiq['ratio']:.2f}\u00d7 the no-op jobs a Dramatiq" in page
    for text in (readme, page):  # no other headline beside it
        assert set(re.findall(r"forks about ([\d,]+) queued", text)) == {f"{round(dramatiq['value'], -2):,.0f}"}
    svg = ET.fromstring(publish.charts(snapshot())["throughput.svg"])
    first = svg.find("{http://www.w3.org/2000/svg}rect[2]")  # the first bar (the background is the first rect)
    assert first is not None
    assert first.findtext("{http://www.w3.org/2000/svg}title") == (
        f"sessionfork\nforks: {charts.number(dramatiq['value'])} jobs per second")
