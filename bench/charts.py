"""The Performance page's charts: SVG written by hand from a benchmark snapshot (``docs/data/bench.json``).

``charts(snapshot)`` maps each file name of ``docs/charts/`` to its SVG text; ``bench.publish`` writes
them, and the page's chart block (``markdown(snapshot)``) shows them, the main claim first: a fork
costs the same on a 10-event parent and on a 100,000-event one. No plotting library and no service:
the text is a pure function of the snapshot, so a test compares the files with it, as it does the
tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final
from xml.sax.saxutils import escape

WIDTH: Final = 410
HEIGHT: Final = 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 44, 56
COLORS: Final = ("#3f51b5", "#009688", "#9e9e9e")
FONT: Final = 'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif"'

PARENT_SIZES: Final = (10, 1000, 100000)
FORK_US: Final = "fork µs, {}-event parent"
FORK_BYTES: Final = "Redis bytes/child, {}-event parent"
DEPTHS: Final = (1, 100, 1000)
DEPTH_BYTES: Final = "Redis bytes/child, lineage depth {}"
QUEUED: Final = "forks/s, one worker process, requests queued first (median of rounds)"
"""The headline figure: one worker process draining a queued backlog (the README and the page quote it)."""
PEERS: Final = (("Huey\nno-op jobs", "Huey no-op (8 threads, no results) jobs/s"),
                 ("Dramatiq\nno-op jobs", "Dramatiq no-op (8 threads) jobs/s"),
                 ("RQ Simple-\nWorker no-op", "RQ SimpleWorker no-op jobs/s"))
"""The peers measured beside it in the same rounds, each a baseline of the headline's rows."""
FILES: Final = ("fork-time.svg", "fork-bytes.svg", "throughput.svg", "lineage-depth.svg")


def nice_top(value: float) -> float:
    """The y axis's top: the first 1, 2, 2.5 or 5 times 10^k at or above ``value`` (1 for nothing to show)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1.0, 2.0, 2.5, 5.0, 10.0) if step * power >= value)


def number(value: float) -> str:
    """A figure as a label: thousands separated, one decimal under 100, none above."""
    return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def _frame(title: str, unit: str, top: float) -> list[str]:
    """The chart's box: title, y axis from 0 to ``top`` (five ticks, gridlines) with its unit."""
    plot_h = HEIGHT - TOP - BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" {FONT} font-size="12">',
           f"<title>{escape(title)}</title>",
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
           f'<text x="{WIDTH / 2:.1f}" y="22" text-anchor="middle" font-size="14" font-weight="600" '
           f'fill="#212121">{escape(title)}</text>',
           f'<text x="14" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" fill="#616161" '
           f'transform="rotate(-90 14 {TOP + plot_h / 2:.1f})">{escape(unit)}</text>']
    for i in range(6):
        value = top * i / 5
        y = TOP + plot_h - plot_h * i / 5
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
                   f'stroke="{"#9e9e9e" if i == 0 else "#e0e0e0"}"/>')
        tick = f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#616161">{tick}</text>')
    return out


def y_of(value: float, top: float) -> float:
    """The pixel row of ``value`` on an axis from 0 to ``top``."""
    plot_h = HEIGHT - TOP - BOTTOM
    return TOP + plot_h - plot_h * value / top


def line_chart(title: str, unit: str, labels: Sequence[str], values: Sequence[float]) -> str:
    """One series over evenly spaced categories (``labels``), points labelled with their values."""
    top = nice_top(max(values) * 1.15)
    step = (WIDTH - LEFT - RIGHT) / len(labels)
    points = [(LEFT + step * (i + 0.5), y_of(v, top)) for i, v in enumerate(values)]
    out = _frame(title, unit, top)
    out.append(f'<polyline fill="none" stroke="{COLORS[0]}" stroke-width="2.5" '
               f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in points)}"/>')
    for (x, y), label, value in zip(points, labels, values, strict=True):
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{COLORS[0]}"><title>{escape(label)}: '
                f"{number(value)} {escape(unit)}</title></circle>",
                f'<text x="{x:.1f}" y="{y - 10:.1f}" text-anchor="middle" fill="#212121">{number(value)}</text>',
                f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle" fill="#424242">'
                f"{escape(label)}</text>"]
    return "\n".join([*out, "</svg>", ""])


def bar_chart(title: str, unit: str, bars: Sequence[tuple[str, float]]) -> str:
    """Bars side by side, the first in the project's colour, each labelled with its value."""
    top = nice_top(max(v for _, v in bars) * 1.15)
    step = (WIDTH - LEFT - RIGHT) / len(bars)
    out = _frame(title, unit, top)
    for i, (label, value) in enumerate(bars):
        x, y = LEFT + step * i + step * 0.2, y_of(value, top)
        width, color = step * 0.6, COLORS[0] if i == 0 else COLORS[2]
        out += [f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{HEIGHT - BOTTOM - y:.1f}" '
                f'fill="{color}"><title>{escape(label)}: {number(value)} {escape(unit)}</title></rect>',
                f'<text x="{x + width / 2:.1f}" y="{y - 6:.1f}" text-anchor="middle" fill="#212121">'
                f"{number(value)}</text>"]
        for n, line in enumerate(label.split("\n")):
            out.append(f'<text x="{x + width / 2:.1f}" y="{HEIGHT - BOTTOM + 18 + 14 * n}" text-anchor="middle" '
                       f'fill="#424242">{escape(line)}</text>')
    return "\n".join([*out, "</svg>", ""])


def _figures(snapshot: dict[str, Any]) -> dict[tuple[str, str], float]:
    """The first run's figures by (figure, baseline) name, and the baselines' own values."""
    out: dict[tuple[str, str], float] = {}
    for f in snapshot["runs"][0]["figures"]:
        out[(f["figure"], f["baseline"])] = f["value"]
        out.setdefault((f["baseline"], ""), f["baselineValue"])
        out.setdefault((f["figure"], ""), f["value"])
    return out


def _baselines(snapshot: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Each baseline's value by (figure, baseline) name: one baseline name may carry another value
    under another figure (RQ's no-op jobs/s of the single-fork rounds and of the per-process ones)."""
    return {(f["figure"], f["baseline"]): f["baselineValue"] for f in snapshot["runs"][0]["figures"]}


def charts(snapshot: dict[str, Any]) -> dict[str, str]:
    """Each chart's file name (``FILES``) and SVG text, from the snapshot's first run (the current RQ)."""
    figures = _figures(snapshot)
    baselines = _baselines(snapshot)
    sizes = [f"{n:,} events" for n in PARENT_SIZES]
    return {
        "fork-time.svg": line_chart("Fork time by the parent's length", "µs per fork", sizes,
                                    [figures[(FORK_US.format(n), "")] for n in PARENT_SIZES]),
        "fork-bytes.svg": line_chart("Redis memory per child by the parent's length", "bytes per child", sizes,
                                     [figures[(FORK_BYTES.format(n), "")] for n in PARENT_SIZES]),
        "throughput.svg": bar_chart("One worker process, its jobs queued first", "jobs per second", [
            ("sessionfork\nforks", figures[(QUEUED, "")]),
            *((label, baselines[(QUEUED, baseline)]) for label, baseline in PEERS)]),
        "lineage-depth.svg": line_chart("Redis memory per child by lineage depth", "bytes per child",
                                        [f"depth {d:,}" for d in DEPTHS],
                                        [figures[(DEPTH_BYTES.format(d), "")] for d in DEPTHS]),
    }


def markdown(snapshot: dict[str, Any]) -> str:
    """The page's chart block (between ``bench.publish``'s chart markers): the claim in words, then the charts."""
    figures = _figures(snapshot)
    small, large = (figures[(FORK_US.format(n), "")] for n in (PARENT_SIZES[0], PARENT_SIZES[-1]))
    held = [figures[(FORK_BYTES.format(n), "")] for n in PARENT_SIZES]
    return "\n".join([
        f"A fork costs the same on a 10-event parent and on a 100,000-event one: {small:,.0f} µs and "
        f"{large:,.0f} µs, {min(held):,.0f} to {max(held):,.0f} Redis bytes per child (seeds are references, "
        f"not copies; run of {snapshot['date']}, RQ {snapshot['runs'][0]['rq']}).",
        "",
        "![Fork time by the parent's length: flat from 10 to 100,000 events](charts/fork-time.svg)",
        "![Redis memory per child by the parent's length: flat](charts/fork-bytes.svg)",
        "![One worker process's forks/s against Huey's, Dramatiq's and RQ's no-op jobs/s](charts/throughput.svg)",
        "![Redis memory per child by lineage depth: flat](charts/lineage-depth.svg)",
    ])
