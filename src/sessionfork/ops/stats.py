"""The outcome stream for operators: follow it, format it, summarise it.

Entries of ``sf:outcomes`` carry ``request``, ``code`` (``OK`` or an error code), ``us`` (time to
run the request), ``lat`` (from enqueue to outcome; both microseconds, 0 when unknown) and
``reply`` (the reply event JSON).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..core import keys, wire
from ..core.wire import ForkFailure, ForkResult

_COLOURS = {"OK": "green", "OPEN_TURN": "yellow", "INVALID_BOUNDARY": "yellow", "SESSION_ALREADY_EXISTS": "yellow",
            "INVALID_REQUEST": "magenta", "IDEMPOTENCY_CONFLICT": "magenta", "INTERNAL": "red"}


class Outcome(msgspec.Struct, rename="camel", kw_only=True):
    """One outcome stream entry (wire shape of ``sessionfork events --json``)."""

    id: str
    time: int
    request_id: str
    code: str
    duration_us: int
    reply: wire.ForkResult | wire.ForkFailure
    latency_us: int = 0


def read_outcomes(redis: Any, *, start: str = "-", follow: bool = False, block_ms: int = 1000,
                  batch: int = 500) -> Iterator[Outcome]:
    """Outcomes from ``start`` (``-`` = the beginning, ``$`` = only new ones), then live if ``follow``."""
    last = start
    if start != "$":
        while True:
            lo = last if last == "-" else f"({last}"
            entries = redis.xrange(keys.OUTCOME_STREAM, min=lo, max="+", count=batch)
            for entry_id, fields in entries:
                last = wire.text(entry_id)
                yield _outcome(last, fields)
            if len(entries) < batch:
                break
        if last == "-":
            last = "0-0"
    while follow:
        for _, entries in redis.xread({keys.OUTCOME_STREAM: last}, block=block_ms, count=batch) or []:
            for entry_id, fields in entries:
                last = wire.text(entry_id)
                yield _outcome(last, fields)


def _outcome(entry_id: str, fields: dict[Any, Any]) -> Outcome:
    f = {wire.text(k): v for k, v in fields.items()}
    return Outcome(id=entry_id, time=int(entry_id.split("-")[0]), request_id=wire.text(f["request"]),
                   code=wire.text(f["code"]), duration_us=int(f.get("us", 0)), reply=wire.decode_reply(f["reply"]),
                   latency_us=int(f.get("lat", 0)))


def format_line(outcome: Outcome, style: Any = None) -> str:
    """One terminal line; ``style`` is ``click.style`` on a terminal, else plain."""
    when = datetime.fromtimestamp(outcome.time / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
    code = outcome.code if style is None else style(outcome.code.ljust(22), fg=_COLOURS.get(outcome.code, "cyan"))
    reply = outcome.reply
    if isinstance(reply, ForkFailure):
        detail = reply.message
    elif isinstance(reply, ForkResult) and reply.session is not msgspec.UNSET:
        detail = f"{reply.session.id} <- {reply.session.parent_session} (seed {reply.session.seed_length})"
    elif isinstance(reply, ForkResult) and reply.sessions is not msgspec.UNSET:
        detail = f"{len(reply.sessions)} children"
    else:
        detail = ""
    return f"{when}  {code.ljust(22) if style is None else code}  {outcome.request_id}  " \
           f"{outcome.duration_us / 1000:.2f}ms  {detail}"


class Percentiles(msgspec.Struct, kw_only=True):
    """p50/p90/p99 in milliseconds (``None`` without samples)."""

    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None


class Stats(msgspec.Struct, kw_only=True):
    """Counts per outcome code and percentiles over a window (``stats --json``).

    ``run_time``: from a worker taking up a request to its outcome; ``latency``: from enqueue to
    outcome (what a scheduler waits).
    """

    window_seconds: int
    total: int
    codes: dict[str, int]
    run_time: Percentiles
    latency: Percentiles


def _percentiles(samples: list[float]) -> Percentiles:
    if len(samples) >= 2:
        q = statistics.quantiles(samples, n=100, method="inclusive")
        return Percentiles(p50_ms=q[49], p90_ms=q[89], p99_ms=q[98])
    if samples:
        return Percentiles(p50_ms=samples[0], p90_ms=samples[0], p99_ms=samples[0])
    return Percentiles()


def compute_stats(redis: Any, window_seconds: int, now_ms: int) -> Stats:
    since = now_ms - window_seconds * 1000
    codes: Counter[str] = Counter()
    run_times: list[float] = []
    latencies: list[float] = []
    for outcome in read_outcomes(redis, start=f"{since}-0"):
        codes[outcome.code] += 1
        if outcome.duration_us:
            run_times.append(outcome.duration_us / 1000)
        if outcome.latency_us:
            latencies.append(outcome.latency_us / 1000)
    return Stats(window_seconds=window_seconds, total=sum(codes.values()), codes=dict(sorted(codes.items())),
                 run_time=_percentiles(run_times), latency=_percentiles(latencies))


def render_stats(stats: Stats) -> str:
    lines = [f"outcomes in the last {stats.window_seconds}s: {stats.total}"]
    width = max((len(c) for c in stats.codes), default=4)
    lines += [f"  {code.ljust(width)}  {n}" for code, n in stats.codes.items()]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} ms"

    for label, p in (("run time", stats.run_time), ("enqueue→outcome", stats.latency)):
        lines.append(f"{label}: p50 {ms(p.p50_ms)}  p90 {ms(p.p90_ms)}  p99 {ms(p.p99_ms)}")
    return "\n".join(lines)
