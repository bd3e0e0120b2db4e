"""Merges and selects: ``python -m bench.merges [--quick]`` alone, or as part of ``bench.main``.

Time: one ``sessionfork worker`` process, the requests of a batch submitted at once and timed
first submit → last reply read on the reply channel (as ``measure.fork_throughput`` times forks),
so each figure is µs per request through the real queue and worker. Each round has five batches:
plain forks of a 10-event parent (the baseline), summary merges of a child (one turn of its own)
of a ``big``-event parent into it, ``events`` merges of 100 events (a child with 25 turns of 4
events) into a 10-event parent, 64-child fan-outs of a 10-event parent, and 64-candidate selects
(mode ``summary``) into a 10-event parent, timed in alternating chunks (``merge_times``); the
median over every chunk of a kind is kept. Every round's sessions are made beforehand, in this
process, and every reply is checked ``ok`` after the timing.

Memory: ``MEMORY USAGE`` of the parent's keys (record, log, turn index, merges index) before and
after ``merges`` merges (library calls with generated request ids, as the worker makes them, of
children with generated ids; after a warm-up), less the merged content's own stored bytes (the
summary event, or the range's events as the parent stores them, each with its provenance): what a
merge adds to its parent beyond what it brings. The rest is the merge's own turn (``turn/start``,
``session/merge``, ``turn/end``), its merges-index entries and the turn index's two entries
(``MergeBytes.render``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis

from bench.measure import flushed, replies_timed, start_fork_workers, stop_processes, write_session
from sessionfork.clients.client import Client
from sessionfork.core import forks, keys
from sessionfork.core.config import Settings
from sessionfork.core.merges import merge
from sessionfork.core.registry import Registry
from sessionfork.core.wire import AnyRequest, NewEvent
from sessionfork.embedded import EmbeddedServer

Row = tuple[str, float, str, float | None, str]
FAN = 64
"""Children of a fan-out, candidates of a select."""
EVENT_TURNS = 25
"""Turns of 4 events the child of an ``events`` merge brings back (100 events)."""
BYTES_BAR = 512.0
"""Redis bytes a merge may add to its parent beyond the merged events' own."""
SUMMARY = {"text": "tried the migration on a branch: it works, tests green"}


def fork_row() -> str:
    return "fork µs/request through a worker, 10-event parent (merge baseline, median of chunks)"


def summary_row(big: int) -> str:
    return f"summary merge µs/request through a worker, child of a {big}-event parent"


EVENTS_ROW = "events merge µs/request through a worker, 100 events (25 turns of 4)"
FAN_ROW = f"fan-out µs/request through a worker, {FAN} children (merge baseline)"
SELECT_ROW = f"select µs/request through a worker, {FAN} candidates (mode summary)"
SUMMARY_BYTES_ROW = "Redis bytes a summary merge adds to its parent, less its summary event as stored"
EVENTS_BYTES_ROW = "Redis bytes an events merge (100 events) adds to its parent, less the merged events as stored"
EVENTS_JSON_ROW = "  the same, less only the merged events' JSON (the list's encoding of them counted in)"


def session_of(registry: Registry, sid: str, events: int) -> None:
    """A root session of exactly ``events`` events, in whole turns (4-event turns, then a shorter one)."""
    write_session(registry, sid, events - events % 4)
    rest = events % 4
    if rest >= 2:
        middle = [NewEvent("user/message", {"text": "x" * 40})] * (rest - 2)
        registry.append(sid, [NewEvent("turn/start", {"turn": -1}), *middle, NewEvent("turn/end", {"turn": -1})])


def turns(n: int) -> list[NewEvent]:
    """``n`` turns of 4 events (a branch's own work)."""
    out: list[NewEvent] = []
    for t in range(n):
        out += [NewEvent("turn/start", {"turn": t}), NewEvent("user/message", {"text": "x" * 40}),
                NewEvent("assistant/message", {"text": "y" * 80}), NewEvent("turn/end", {"turn": t})]
    return out


def branches(registry: Registry, parent: str, ids: Sequence[str], own_turns: int) -> None:
    """Children ``ids`` of ``parent`` (one fan-out), each with ``own_turns`` turns of its own."""
    for start in range(0, len(ids), 256):
        made = forks.fork_many(registry, parent, ids[start:start + 256])
        assert not made.failed, made.failed[:1]
    own = turns(own_turns)
    for cid in ids:
        registry.append(cid, own)


def timed(redis: Redis, client: Client, batch: Sequence[AnyRequest]) -> float:
    """Seconds from ``batch``'s first submit (all submitted at once) to its last reply on the reply
    channel (one worker draining); then every reply is checked ``ok``."""
    def submit() -> None:
        for request in batch:
            client.submit(request)

    elapsed = replies_timed(redis, client.settings.reply_channel, len(batch), submit)
    failed = [reply for reply in (client.wait(request, 30) for request in batch) if not reply.ok]
    assert not failed, failed[:1]
    return elapsed


@dataclass(frozen=True)
class Sizes:
    """How much a round holds: ``single`` requests of the one-child kinds (fork, merges), ``fan`` of
    the 64-wide ones (fan-out, select), timed in ``chunks`` alternating chunks; ``big``: the summary
    merge's parent's events."""

    single: int
    fan: int
    chunks: int
    big: int


QUICK = Sizes(single=10, fan=2, chunks=1, big=2_000)
FULL = Sizes(single=250, fan=50, chunks=10, big=100_000)


class Rounds:
    """The sessions every round's batches work on, made once (the worker idle meanwhile), and the batches."""

    def __init__(self, redis: Redis, sizes: Sizes) -> None:
        self.redis, self.sizes = redis, sizes
        self.registry, self.client = Registry(redis), Client(redis, Settings())
        for sid in ("m-fork", "m-small", "m-fan", "m-sel"):
            session_of(self.registry, sid, 10)
        session_of(self.registry, "m-big", sizes.big)

    def forks(self, r: int) -> list[AnyRequest]:
        return [self.client.request("m-fork", session_id=f"f{r}-{i}", request_id=f"f{r}-{i}")
                for i in range(self.sizes.single)]

    def summary_merges(self, r: int) -> list[AnyRequest]:
        ids = [f"s{r}-{i}" for i in range(self.sizes.single)]
        branches(self.registry, "m-big", ids, 1)
        return [self.client.merge_request("m-big", cid, mode="summary", summary=SUMMARY, request_id=f"ms-{cid}")
                for cid in ids]

    def events_merges(self, r: int) -> list[AnyRequest]:
        ids = [f"e{r}-{i}" for i in range(self.sizes.single)]
        branches(self.registry, "m-small", ids, EVENT_TURNS)
        return [self.client.merge_request("m-small", cid, mode="events", request_id=f"me-{cid}") for cid in ids]

    def fan_outs(self, r: int) -> list[AnyRequest]:
        return [self.client.request("m-fan", count=FAN, request_id=f"n{r}-{i}") for i in range(self.sizes.fan)]

    def selects(self, r: int) -> list[AnyRequest]:
        out: list[AnyRequest] = []
        for i in range(self.sizes.fan):
            ids = [f"c{r}-{i}-{c}" for c in range(FAN)]
            branches(self.registry, "m-sel", ids, 1)
            out.append(self.client.select_request("m-sel", ids, ids[i % FAN], mode="summary", summary=SUMMARY,
                                                  request_id=f"sel{r}-{i}"))
        return out


def merge_times(server: EmbeddedServer, rounds: int, sizes: Sizes,
                step: Callable[[str, Callable[[], Any]], Any] = lambda _, fn: fn()) -> dict[str, float]:
    """Median µs per request of each kind (``fork``, ``summary``, ``events``, ``fan``, ``select``)
    over every chunk of ``rounds`` rounds. A round makes every kind's sessions first, then times
    the kinds in ``sizes.chunks`` alternating chunks (the kinds' order rotated each round): a
    change of the machine's load weighs on every kind alike, and the median keeps a chunk that a
    burst of load hit from moving the figure."""
    redis = flushed(server)
    made = Rounds(redis, sizes)
    kinds: dict[str, Callable[[int], list[AnyRequest]]] = {
        "fork": made.forks, "summary": made.summary_merges, "events": made.events_merges, "fan": made.fan_outs,
        "select": made.selects}
    order = list(kinds)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    procs, _ = start_fork_workers(server, 1)
    try:
        warm = [made.client.request("m-fork", session_id=f"w-{i}") for i in range(20)]
        timed(redis, made.client, warm)  # scripts loaded, connections made, the worker's imports done
        for r in range(rounds):
            rotated = order[r % len(order):] + order[:r % len(order)]
            batches: dict[str, list[AnyRequest]] = step(f"merges: sessions of round {r + 1}",
                                                        lambda r=r, k=rotated: {x: kinds[x](r) for x in k})  # type: ignore[misc]

            def chunks(batches: dict[str, list[AnyRequest]] = batches) -> None:
                for c in range(sizes.chunks):
                    for kind, batch in batches.items():
                        per = -(-len(batch) // sizes.chunks)
                        chunk = batch[c * per:(c + 1) * per]
                        if chunk:
                            times[kind].append(timed(redis, made.client, chunk) / len(chunk) * 1e6)

            step(f"merges: {', '.join(f'{len(batches[k])} {k}' for k in rotated)} requests in {sizes.chunks} "
                 f"alternating chunks, round {r + 1}", chunks)
    finally:
        stop_processes(procs)
    print("merges, µs per request by chunk: " + "; ".join(f"{k} {' '.join(f'{x:,.0f}' for x in v)}"
                                                        for k, v in times.items()), file=sys.stderr)
    print("merges, µs per request, least and median of the chunks: " + "; ".join(
        f"{k} {min(v):,.0f} {statistics.median(v):,.0f}" for k, v in times.items()), file=sys.stderr)
    return {k: statistics.median(v) for k, v in times.items()}


@dataclass(frozen=True)
class MergeBytes:
    """Redis bytes ``merges`` merges added to their parent, per merge: ``total`` (its keys'
    ``MEMORY USAGE``), by key (``keys``), and what the merged content itself takes: ``own`` (the
    bytes of a list holding just the content's entries: the events as Redis stores them) and
    ``json`` (the entries' lengths alone, without the list's few bytes of encoding per entry)."""

    merges: int
    total: float
    own: float
    json: float
    wrapper: float
    keys: dict[str, float]

    @property
    def added(self) -> float:
        """What a merge adds beyond the merged events' own stored bytes (bar: ``BYTES_BAR``)."""
        return self.total - self.own

    @property
    def added_json(self) -> float:
        """What a merge adds beyond the merged events' JSON alone (the list's encoding of them counted in)."""
        return self.total - self.json

    def render(self) -> str:
        rows = [*sorted(self.keys.items()), ("total per merge", self.total),
                ("  merged content, as a list stores it", self.own), ("  merged content, its JSON alone", self.json),
                ("  the merge's turn/start, session/merge, turn/end (JSON)", self.wrapper),
                (f"  added beyond the stored content (bar {BYTES_BAR:,.0f})", self.added),
                ("  added beyond the content's JSON", self.added_json)]
        return "\n".join(f"{label:<58}{value:>10,.1f}" for label, value in rows)


def merge_bytes(server: EmbeddedServer, merges: int, mode: str, warmup: int = 20) -> MergeBytes:
    """Bytes per merge of mode ``mode`` (a child with one turn, ``summary``; with 25 turns,
    ``events``) into a 10-event parent, over ``merges`` merges after ``warmup`` (see the module)."""
    redis = flushed(server)
    registry = Registry(redis)
    session_of(registry, "parent", 10)
    own_turns = 1 if mode == "summary" else EVENT_TURNS
    # Generated ids (session-<uuid4>, req-<uuid4>), as the public client makes them (bench.memory's
    # too): the merge's events and its index entries name the child and the request.
    ids = [f"session-{uuid.uuid4()}" for _ in range(warmup + merges)]
    branches(registry, "parent", ids, own_turns)
    family = {"record": keys.session("parent"), "log": keys.session_log("parent"),
              "turn index": keys.session_turns("parent"), "merges index": keys.session_merges("parent")}

    def usage(key: str) -> int:
        return int(redis.memory_usage(key, samples=0) or 0)

    def merge_one(cid: str) -> None:
        if mode == "summary":
            merge(registry, "parent", cid, mode="summary", summary=SUMMARY, request_id=f"req-{uuid.uuid4()}")
        else:
            merge(registry, "parent", cid, mode="events", request_id=f"req-{uuid.uuid4()}")

    for cid in ids[:warmup]:
        merge_one(cid)
    before, at = {name: usage(key) for name, key in family.items()}, int(redis.llen(keys.session_log("parent")))
    for cid in ids[warmup:]:
        merge_one(cid)
    after = {name: usage(key) for name, key in family.items()}
    stored = [e if isinstance(e, bytes) else e.encode() for e in redis.lrange(keys.session_log("parent"), at, -1)]
    turn = len(stored) // merges  # turn/start, session/merge, the content, turn/end
    content = [e for m in range(merges) for e in stored[m * turn + 2:(m + 1) * turn - 1]]
    wrapper = sum(len(e) for m in range(merges) for e in (stored[m * turn], stored[m * turn + 1],
                                                          stored[(m + 1) * turn - 1]))
    scratch = "bench:merged-content"  # not a sessionfork key: the bench's own, deleted right after
    for start in range(0, len(content), 1000):
        redis.rpush(scratch, *content[start:start + 1000])
    own = usage(scratch)
    redis.delete(scratch)
    return MergeBytes(merges, (sum(after.values()) - sum(before.values())) / merges, own / merges,
                      sum(len(e) for e in content) / merges, wrapper / merges,
                      {f"{name} {family[name]}": (after[name] - before[name]) / merges for name in family})


def merge_rows(server: EmbeddedServer, rounds: int, sizes: Sizes,
               step: Callable[[str, Callable[[], Any]], Any] = lambda _, fn: fn()) -> list[Row]:
    """The bench rows: per-request times and their ratios against the issue's targets (summary merge
    at most 1.5 times a plain fork, events merge 3 times, a 64-candidate select twice a 64-child fan-out), and
    the bytes a merge adds to its parent (≤ 512 beyond the merged events' own)."""
    t = merge_times(server, rounds, sizes, step)
    quick = sizes == QUICK
    by_summary = step("merges: bytes per summary merge", lambda: merge_bytes(server, 50 if quick else 1000, "summary"))
    by_events = step("merges: bytes per events merge", lambda: merge_bytes(server, 20 if quick else 200, "events"))
    print(f"bytes per summary merge:\n{by_summary.render()}\nbytes per events merge (100 events):\n"
          f"{by_events.render()}", file=sys.stderr)
    rows: list[Row] = [
        (fork_row(), t["fork"], fork_row(), t["fork"], ""),
        (summary_row(sizes.big), t["summary"], fork_row(), t["fork"], "≤ 1.5"),
        (EVENTS_ROW, t["events"], fork_row(), t["fork"], "≤ 3"),
        (FAN_ROW, t["fan"], fork_row(), t["fork"], ""),
        (SELECT_ROW, t["select"], FAN_ROW, t["fan"], "≤ 2"),
        (SUMMARY_BYTES_ROW, by_summary.added, "limit bytes", BYTES_BAR, "≤ 1"),
        (EVENTS_BYTES_ROW, by_events.added, "limit bytes", BYTES_BAR, "≤ 1"),
        (EVENTS_JSON_ROW, by_events.added_json, "limit bytes", BYTES_BAR, ""),
    ]
    for figure, value, _, base, bar in rows:
        if bar and base:
            limit = float(bar.split()[-1])
            print(f"{'PASS' if value / base <= limit else 'FAIL'} {figure}: {value / base:.2f} (target {bar})",
                  file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    from bench.publish import table

    parser = argparse.ArgumentParser(prog="bench.merges", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs, not speed")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with EmbeddedServer() as server:
        rows = merge_rows(server, 1 if args.quick else args.rounds, QUICK if args.quick else FULL,
                          step=lambda label, fn: (print(f"… {label}", file=sys.stderr, flush=True), fn())[1])
    print("\n".join(table([{"figure": r[0], "value": r[1], "baseline": r[2], "baselineValue": r[3],
                            "ratio": r[1] / r[3] if r[3] else None, "bar": r[4]} for r in rows])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
