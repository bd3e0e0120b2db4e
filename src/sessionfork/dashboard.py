"""The outcome stream for operators: follow it, format it, summarise it.

Entries of ``sf:outcomes`` carry ``request``, ``code`` (``OK`` or an error code), ``us`` (time to
run the request, microseconds) and ``reply`` (the reply event JSON).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec

from . import keys, wire
from .wire import ForkFailure, ForkResult

_COLOURS = {"OK": "green", "OPEN_TURN": "yellow", "SESSION_ALREADY_EXISTS": "yellow",
            "INVALID_REQUEST": "magenta", "IDEMPOTENCY_CONFLICT": "magenta", "INTERNAL": "red"}


class Outcome(msgspec.Struct, rename="camel", kw_only=True):
    """One outcome stream entry (wire shape of ``sessionfork events --json``)."""

    id: str
    time: int
    request_id: str
    code: str
    duration_us: int
    reply: wire.ForkResult | wire.ForkFailure


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
                   code=wire.text(f["code"]), duration_us=int(f.get("us", 0)), reply=wire.decode_reply(f["reply"]))


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


class Stats(msgspec.Struct, kw_only=True):
    """Counts per outcome code and run-time percentiles (ms) over a window (``stats --json``)."""

    window_seconds: int
    total: int
    codes: dict[str, int]
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None


def compute_stats(redis: Any, window_seconds: int, now_ms: int) -> Stats:
    since = now_ms - window_seconds * 1000
    codes: Counter[str] = Counter()
    durations: list[float] = []
    for outcome in read_outcomes(redis, start=f"{since}-0"):
        codes[outcome.code] += 1
        if outcome.duration_us:
            durations.append(outcome.duration_us / 1000)
    pct: list[float | None] = [None, None, None]
    if len(durations) >= 2:
        q = statistics.quantiles(durations, n=100, method="inclusive")
        pct = [q[49], q[89], q[98]]
    elif durations:
        pct = [durations[0]] * 3
    return Stats(window_seconds=window_seconds, total=sum(codes.values()), codes=dict(sorted(codes.items())),
                 p50_ms=pct[0], p90_ms=pct[1], p99_ms=pct[2])


def render_stats(stats: Stats) -> str:
    lines = [f"outcomes in the last {stats.window_seconds}s: {stats.total}"]
    width = max((len(c) for c in stats.codes), default=4)
    lines += [f"  {code.ljust(width)}  {n}" for code, n in stats.codes.items()]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} ms"

    lines.append(f"run time: p50 {ms(stats.p50_ms)}  p90 {ms(stats.p90_ms)}  p99 {ms(stats.p99_ms)}")
    return "\n".join(lines)
