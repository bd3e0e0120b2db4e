"""The outcome stream for operators: follow it, format it, summarise it.

Entries of ``sf:outcomes`` carry ``requestId``, ``code`` (``OK`` or an error code), ``durationUs``
(time to run the request), ``latencyUs`` (from enqueue to outcome; both microseconds, 0 when
unknown) and ``reply`` (the reply event JSON): ``protocol.outcomes.STREAM_FIELDS``. Entries written
before 0.2 (``request``, ``us``, ``lat``) read the same (``stream_entry``).

A sharded queue has one stream per shard: ``read_sharded`` merges them in time order and
``compute_stats`` over several servers gives the whole and each shard (``shard`` is the index).
"""

from __future__ import annotations

import heapq
import statistics
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..core import keys, wire
from ..protocol import operations
from ..protocol.outcomes import stream_entry

_COLOURS = {"OK": "green", "OPEN_TURN": "yellow", "INVALID_BOUNDARY": "yellow", "SESSION_ALREADY_EXISTS": "yellow",
            "INVALID_REQUEST": "magenta", "IDEMPOTENCY_CONFLICT": "magenta", "WRONG_SHARD": "magenta",
            "INTERNAL": "red"}


class Outcome(msgspec.Struct, rename="camel", kw_only=True):
    """One outcome stream entry (wire shape of ``sessionfork outcomes --json``)."""

    id: str
    time: int
    request_id: str
    code: str
    duration_us: int
    reply: wire.Outcome
    latency_us: int = 0
    shard: int | msgspec.UnsetType = msgspec.UNSET
    """The shard whose stream holds it (a sharded queue only)."""


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
                yield outcome_of(last, fields)
            if len(entries) < batch:
                break
        if last == "-":
            last = "0-0"
    while follow:
        for _, entries in redis.xread({keys.OUTCOME_STREAM: last}, block=block_ms, count=batch) or []:
            for entry_id, fields in entries:
                last = wire.text(entry_id)
                yield outcome_of(last, fields)


def read_sharded(shards: Sequence[Any], *, start: str = "-", follow: bool = False,
                 block_ms: int = 1000, batch: int = 500) -> Iterator[Outcome]:
    """``read_outcomes`` over every shard's stream (clients in shard order), merged by entry time
    and tagged with their ``shard``; one server: exactly ``read_outcomes``. Following, the shards
    are read in turn, each blocking at most ``block_ms / len(shards)``. ``start="$"`` means the
    outcomes stored after this call (each stream's newest entry is read now, not at the first
    ``next``)."""
    if len(shards) == 1:
        return read_outcomes(shards[0], start=start, follow=follow, block_ms=block_ms, batch=batch)
    newest = [_newest(redis) for redis in shards] if start == "$" else None
    return _merged(shards, start, newest, follow, max(1, block_ms // len(shards)), batch)


def _merged(shards: Sequence[Any], start: str, newest: list[str] | None, follow: bool, block: int,
            batch: int) -> Iterator[Outcome]:
    if newest is not None:
        last = newest
    else:
        last = ["0-0"] * len(shards)
        tagged = [_tagged(read_outcomes(redis, start=start, batch=batch), i) for i, redis in enumerate(shards)]
        for outcome in heapq.merge(*tagged, key=_order):
            assert isinstance(outcome.shard, int)
            last[outcome.shard] = outcome.id
            yield outcome
    while follow:
        for i, redis in enumerate(shards):
            for _, entries in redis.xread({keys.OUTCOME_STREAM: last[i]}, block=block, count=batch) or []:
                for entry_id, fields in entries:
                    last[i] = wire.text(entry_id)
                    yield msgspec.structs.replace(outcome_of(last[i], fields), shard=i)


def _tagged(outcomes: Iterator[Outcome], shard: int) -> Iterator[Outcome]:
    for outcome in outcomes:
        yield msgspec.structs.replace(outcome, shard=shard)


def _order(outcome: Outcome) -> tuple[int, int, int]:
    ms, _, seq = outcome.id.partition("-")
    return int(ms), int(seq or 0), outcome.shard if isinstance(outcome.shard, int) else 0


def _newest(redis: Any) -> str:
    newest = redis.xrevrange(keys.OUTCOME_STREAM, count=1)
    return wire.text(newest[0][0]) if newest else "0-0"


def outcome_of(entry_id: str, fields: dict[Any, Any]) -> Outcome:
    """One outcome stream entry (its id and fields as read) as an ``Outcome``."""
    f = stream_entry(fields)
    return Outcome(id=entry_id, time=int(entry_id.split("-")[0]), request_id=wire.text(f["requestId"]),
                   code=wire.text(f["code"]), duration_us=int(f["durationUs"]), reply=wire.decode_reply(f["reply"]),
                   latency_us=int(f["latencyUs"]))


def format_line(outcome: Outcome, style: Any = None) -> str:
    """One terminal line; ``style`` is ``click.style`` on a terminal, else plain."""
    when = datetime.fromtimestamp(outcome.time / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
    code = outcome.code if style is None else style(outcome.code.ljust(22), fg=_COLOURS.get(outcome.code, "cyan"))
    reply = outcome.reply
    detail = reply.message if isinstance(reply, wire.Failure) else operations.of_reply(reply).describe(reply)
    shard = "" if isinstance(outcome.shard, msgspec.UnsetType) else f"shard {outcome.shard}  "
    return f"{when}  {shard}{code.ljust(22) if style is None else code}  {outcome.request_id}  " \
           f"{outcome.duration_us / 1000:.2f}ms  {detail}"


class Percentiles(msgspec.Struct, kw_only=True, rename="camel"):
    """p50/p90/p99 in milliseconds (``None`` without samples; JSON ``p50Ms``, ``p90Ms``, ``p99Ms``)."""

    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None


class Stats(msgspec.Struct, kw_only=True, rename="camel"):
    """Counts per outcome code and percentiles over a window (``stats --json``, camelCase:
    ``windowSeconds``, ``total``, ``codes``, ``runTime``, ``latency``, ``shards``).

    ``run_time``: from a worker taking up a request to its outcome; ``latency``: from enqueue to
    outcome (what a scheduler waits).
    """

    window_seconds: int
    total: int
    codes: dict[str, int]
    run_time: Percentiles
    latency: Percentiles
    shards: list[Stats] | msgspec.UnsetType = msgspec.UNSET
    """A sharded queue: the same per shard, in shard order (the fields above are the whole)."""


def _percentiles(samples: list[float]) -> Percentiles:
    if len(samples) >= 2:
        q = statistics.quantiles(samples, n=100, method="inclusive")
        return Percentiles(p50_ms=q[49], p90_ms=q[89], p99_ms=q[98])
    if samples:
        return Percentiles(p50_ms=samples[0], p90_ms=samples[0], p99_ms=samples[0])
    return Percentiles()


def compute_stats(redis: Any, window_seconds: int, now_ms: int) -> Stats:
    """Stats of the outcomes of the last ``window_seconds``; ``redis`` a queue server, or a list
    of them (a sharded queue, in shard order: the whole, and ``shards`` one each)."""
    since = now_ms - window_seconds * 1000
    if not isinstance(redis, list | tuple):
        return _stats(window_seconds, *_samples(redis, since))
    parts = [_samples(shard, since) for shard in redis]
    if len(parts) == 1:
        return _stats(window_seconds, *parts[0])
    codes: Counter[str] = Counter()
    for part in parts:
        codes.update(part[0])
    whole = _stats(window_seconds, codes, [t for p in parts for t in p[1]], [t for p in parts for t in p[2]])
    whole.shards = [_stats(window_seconds, *part) for part in parts]
    return whole


def _samples(redis: Any, since: int) -> tuple[Counter[str], list[float], list[float]]:
    codes: Counter[str] = Counter()
    run_times: list[float] = []
    latencies: list[float] = []
    for outcome in read_outcomes(redis, start=f"{since}-0"):
        codes[outcome.code] += 1
        if outcome.duration_us:
            run_times.append(outcome.duration_us / 1000)
        if outcome.latency_us:
            latencies.append(outcome.latency_us / 1000)
    return codes, run_times, latencies


def _stats(window_seconds: int, codes: Counter[str], run_times: list[float], latencies: list[float]) -> Stats:
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
    for index, shard in enumerate(stats.shards or []):
        lines.append(f"shard {index}: {shard.total} outcomes  {' '.join(f'{c} {n}' for c, n in shard.codes.items())}  "
                     f"enqueue→outcome p50 {ms(shard.latency.p50_ms)}  p99 {ms(shard.latency.p99_ms)}")
    return "\n".join(lines)
