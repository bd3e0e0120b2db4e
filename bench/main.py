"""The benchmark: ``python -m bench.main [--quick] [--queue-only] [--soak S] [--out DIR] [--ab COMMIT]``.

Runs on a throwaway server it starts, and measures in the same run the peers every figure is
compared with: RQ's default ``Worker`` and RQ's ``SimpleWorker`` draining no-op jobs, and a bare
Redis round trip (PING); and, per worker process with the jobs queued first (``bench.peers``),
sessionfork's forks beside RQ's ``SimpleWorker``, Dramatiq's and Huey's no-op jobs (jobs/s, Redis
commands, Redis CPU and worker CPU per job). Prints a markdown table, the per-process table, then a
soak report; writes the figures as JSON (``perProcess``: each system's per-process figures).
``--queue-only`` measures only the figures that depend on RQ (``run.py bench`` runs it again on
RQ 2.12, so both RQ majors are reported side by side). ``--ab COMMIT`` runs only ``bench.ab``: fan-out
and single forks of an older commit's tree and of this one, alternating in one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rq

from bench import peers
from bench.compose import edit_fork_cost, summary_fork_cost, summary_source_freed
from bench.measure import (
    async_vs_sync,
    boundary_fork_costs,
    fork_cost,
    fork_throughput,
    latency,
    noop,
    ping,
    rq_peer,
)
from bench.memory import BAR, bytes_held, child_bytes_at_depth, request_memory, steady_workload
from bench.merges import FULL, QUICK, merge_rows
from bench.publish import table
from bench.redis_cost import redis_cpu_per_job, round_trips, steps_cpu_per_fork, waiter_cpu_us
from bench.shards import shard_rows
from bench.shares import share_rows
from sessionfork.core.config import Settings
from sessionfork.embedded import EmbeddedServer

__all__ = ["main", "noop"]

FAN_OUT = "fan-out children/s (64 per request, median of rounds)"


def _round_trip_rows(server: EmbeddedServer, jobs: int) -> list[tuple[str, float, str, float | None, str]]:
    """The worker-side round trips per job, in batches (the default) and one at a time, each beside
    an RQ ``SimpleWorker`` no-op job's (``redis_cost.round_trips``)."""
    ours, one, simple = round_trips(server, jobs)
    return [("Redis round trips per job, worker side (batches, the default)", ours,
             "RQ SimpleWorker per no-op job", simple, ""),
            ("Redis round trips per job, worker side, one at a time (SESSIONFORK_BATCH=1)", one,
             "RQ SimpleWorker per no-op job", simple, "")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.main", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs, not speed")
    parser.add_argument("--out", default="bench-results", help="directory for bench.json")
    parser.add_argument("--soak", type=float, default=60.0, help="seconds of soak at the end (0: none; --quick: 0)")
    parser.add_argument("--queue-only", action="store_true",
                        help="only the figures that depend on RQ (throughput against RQ's workers, round trips)")
    parser.add_argument("--ab", metavar="COMMIT",
                        help="only an A/B of fan-out and single forks against COMMIT, alternating rounds (bench.ab)")
    args = parser.parse_args(argv)
    if args.ab:
        from bench.ab import main as ab

        return ab([args.ab, *(["--rounds", "1", "--fan-requests", "5", "--singles", "30"] if args.quick else [])])
    q = args.quick
    n, n_fork_peer, lat, kids = (30, 10, 20, 200) if q else (2000, 300, 400, 1000)
    sizes = (10, 1_000, 2_000) if q else (10, 1_000, 100_000)
    rows: list[tuple[str, float, str, float | None, str]] = []
    with EmbeddedServer() as server:
        def step(label: str, fn: Callable[[], Any]) -> Any:
            print(f"… {label}", file=sys.stderr, flush=True)
            return fn()

        pings = step("PING round trips", lambda: ping(server, n * 5))
        # The headline ratio: sessionfork and RQ's SimpleWorker measured in turns, 3 rounds each
        # (1 with --quick), medians kept: a 2-core machine's noise hits both alike.
        rounds = 1 if q else 3
        # Fan-outs (plain and variants) in the same rounds, medians kept like single forks': one shot
        # swung 3,900-12,100 children/s between runs of the same code.
        fan_requests = 5 if q else 100
        simples, singles, fans, varied_fans = [], [], [], []
        # Per worker process, jobs queued first: sessionfork's forks, RQ's, Dramatiq's and Huey's
        # no-op jobs (bench.peers), in the same rounds.
        peer_rounds: list[dict[str, peers.Drain]] = []
        for r in range(rounds):
            simples.append(step(f"RQ SimpleWorker no-op, round {r + 1}", lambda: rq_peer(server, "simple", n)))
            singles.append(step(f"sessionfork single forks, round {r + 1}", lambda: fork_throughput(server, n)))
            fans.append(step(f"fan-out 64, round {r + 1}",
                             lambda: fork_throughput(server, fan_requests, count=64) * 64))
            varied_fans.append(step(f"variants 64, round {r + 1}",
                                    lambda: fork_throughput(server, fan_requests, variants=64) * 64))
            if not args.queue_only:
                peer_rounds.append(peers.one_round(server, n, r, step=step))
        simple, single = statistics.median(simples), statistics.median(singles)
        fan, varied = statistics.median(fans), statistics.median(varied_fans)
        forking = step("RQ Worker no-op", lambda: rq_peer(server, "worker", n_fork_peer))
        rows.append(("single-fork requests/s (1 worker, median of rounds)", single, "RQ SimpleWorker no-op jobs/s",
                     simple, "≥ 0.9"))
        rows.append(("single-fork requests/s (1 worker, median of rounds)", single, "RQ Worker no-op jobs/s",
                     forking, "≥ 4"))
        if args.queue_only:
            rows.extend(step("round trips", lambda: _round_trip_rows(server, 50 if q else 500)))
            return _report(args, rows, pings, None)
        per_process = peers.medians(peer_rounds)
        rows.extend(peers.rows(per_process))
        p50, p99 = step("latency", lambda: latency(server, lat))
        rows.append(("enqueue→reply p50 ms (idle)", p50, "PING ms", 1000 / pings, ""))
        rows.append(("enqueue→reply p99 ms (idle)", p99, "PING ms", 1000 / pings, "< 5 ms"))
        # Fork cost: alternating rounds over the sizes and the boundary fractions, medians kept
        # (single runs swing ±30 % here).
        fractions = (0.1, 0.5, 1.0)
        cost_rounds, bound_rounds = [], []
        for r in range(rounds):
            cost_rounds.append({size: step(f"fork cost, {size}-event parent, round {r + 1}",
                                           lambda s=size: fork_cost(server, s, kids))  # type: ignore[misc]
                                for size in sizes})
            bound_rounds.append(step(f"boundary fork cost, {sizes[-1]}-event parent, round {r + 1}",
                                     lambda: boundary_fork_costs(server, sizes[-1], kids, fractions)))
        costs = {size: (statistics.median(c[size][0] for c in cost_rounds),
                        statistics.median(c[size][1] for c in cost_rounds)) for size in sizes}
        base_us, _ = costs[sizes[0]]
        for size, (us, mem) in costs.items():
            rows.append((f"fork µs, {size}-event parent", us, f"fork µs, {sizes[0]}-event parent", base_us,
                         "≤ 1.5" if size == sizes[-1] else ""))
            rows.append((f"Redis bytes/child, {size}-event parent", mem, "limit bytes", 2048.0, "≤ 1"))
        bounded = {f: (statistics.median(b[f][0] for b in bound_rounds),
                       statistics.median(b[f][1] for b in bound_rounds)) for f in fractions}
        for fraction, (us, mem) in bounded.items():
            at = f"boundary fork at {fraction:.0%} of a {sizes[-1]}-event parent"
            rows.append((f"{at}, µs", us, f"fork µs, {sizes[0]}-event parent", base_us, "≤ 1.5"))
            rows.append((f"{at}, Redis bytes/child", mem, "limit bytes", 2048.0, "≤ 1"))
        edit_us, edit_mem = step(f"fork with 2 edits, {sizes[0]}-event parent",
                                 lambda: edit_fork_cost(server, sizes[0], kids))
        rows.append((f"fork with 2 edits µs, {sizes[0]}-event parent", edit_us, f"fork µs, {sizes[0]}-event parent",
                     base_us, "≤ 1.5"))
        rows.append(("Redis bytes/child with 2 edits, less the edits' own bytes", edit_mem, "limit bytes", 2048.0,
                     "≤ 1"))
        summary_us, summary_mem = step(f"summary fork keeping the last turn, {sizes[-1]}-event parent",
                                       lambda: summary_fork_cost(server, sizes[-1], kids))
        rows.append((f"summary fork keeping the last turn µs, {sizes[-1]}-event parent", summary_us,
                     f"fork µs, {sizes[0]}-event parent", base_us, "≤ 1.5"))
        rows.append(("Redis bytes/child of a summary fork, less its summary event", summary_mem, "limit bytes",
                     2048.0, "≤ 1"))
        held, freed = step(f"deleting the source of a summary child, {sizes[-1]}-event parent",
                           lambda: summary_source_freed(server, sizes[-1]))
        rows.append((f"bytes a deleted {sizes[-1]}-event parent's log holds, summary child keeping the last turn",
                     freed, "the same before the deletion", held, "≤ 0.1"))
        rows.append((FAN_OUT, fan, "target children/s", 10_000.0, "≥ 1"))
        # The same fan-out against single forks of the same rounds: a ratio within one run, which a
        # slow host or a loaded machine moves far less than the absolute rate.
        rows.append((FAN_OUT, fan, "single-fork requests/s (1 worker, median of rounds)", single, "≥ 20"))
        rows.append(("variant fan-out children/s (64 variants, one edit each, median of rounds)", varied,
                     FAN_OUT, fan, "≥ 0.5"))
        # Merges and selects: through one worker, against plain forks and fan-outs of the same rounds.
        rows.extend(merge_rows(server, rounds, QUICK if q else FULL, step=step))
        mem = step("bytes retained per request", lambda: request_memory(server, 100 if q else 1000))
        print(mem.render(), file=sys.stderr)
        rows.append(("Redis bytes retained per completed request", mem.retained, "limit bytes", BAR, "≤ 1"))
        rows.append(("  of which sf:req (request record)", mem.families["sf:req:<id> (request record)"],
                     "limit bytes", BAR, ""))
        rows.append(("  of which the child's record", mem.families["sf:s:{<child>} (child record)"], "limit bytes",
                     BAR, ""))
        rows.append(("  plus capped streams (outcome, lifecycle entry)", mem.capped, "limit bytes", BAR, ""))
        ttl = Settings().outcome_ttl
        for rate in (100, 1000):
            rows.append((f"GB a steady {rate} forks/s holds (default TTL {ttl // 3600} h)",
                         bytes_held(mem.retained, rate, ttl) / 1e9, "GB at the limit",
                         bytes_held(BAR, rate, ttl) / 1e9, "≤ 1"))
        depths = {d: step(f"bytes per child at depth {d}", lambda d=d: child_bytes_at_depth(server, d))  # type: ignore[misc]
                  for d in ((1, 10, 100) if q else (1, 100, 1000))}
        for d, per_child in depths.items():
            rows.append((f"Redis bytes/child, lineage depth {d}", per_child, "bytes/child, depth 1", depths[1],
                         "≤ 2" if d == max(depths) else ""))
        ops = 400 if q else 4000
        for label, keep in (("on", ops // 4), ("off", None)):
            st = step(f"steady workload, retention {label}",
                      lambda k=keep: steady_workload(server, ops, retention_ops=k))  # type: ignore[misc]
            rows.append((f"steady create→fork→dispose, retention {label}: used memory at end", float(st.end),
                         "used memory half-way", float(st.middle), "≤ 1.10" if keep else "grows"))
        rows.extend(step("round trips", lambda: _round_trip_rows(server, 50 if q else 500)))
        cpu_jobs = 100 if q else 1000
        # Alternating rounds (no-op burst, fork bursts, waiting scheduler), medians kept: single
        # runs swing ±40 % on a shared 2-core machine.
        cpu_rounds = [step(f"Redis CPU per job, round {r + 1}", lambda: redis_cpu_per_job(server, cpu_jobs))
                      for r in range(rounds)]
        batched_cpu, fork_cpu, noop_cpu = (statistics.median(r[i] for r in cpu_rounds) for i in range(3))
        rows.append(("Redis CPU µs per fork, worker side (queue + registry, batches, the default, median of rounds)",
                     batched_cpu, "Redis CPU µs per RQ SimpleWorker no-op job", noop_cpu, "≤ 0.5"))
        # One at a time: what a fork costs when requests arrive apart (a waiting scheduler's), and
        # the figure the rows below (own steps, RQ's share, capacity) build on.
        rows.append(("Redis CPU µs per fork, worker side, one at a time (SESSIONFORK_BATCH=1, median of rounds)",
                     fork_cpu, "Redis CPU µs per RQ SimpleWorker no-op job", noop_cpu, ""))
        # The same fork without its RQ job: how much of the worker side is RQ's per-job bookkeeping.
        steps = statistics.median(step(f"Redis CPU of the fork steps alone, round {r + 1}",
                                       lambda: steps_cpu_per_fork(server, cpu_jobs)) for r in range(rounds))
        rows.append(("Redis CPU µs per fork, sessionfork's own steps (no RQ job: claim, source, child, record)",
                     steps, "Redis CPU µs per RQ SimpleWorker no-op job", noop_cpu, ""))
        rows.append(("Redis CPU µs per fork job spent on RQ's job bookkeeping (one at a time, less own steps)",
                     fork_cpu - steps, "Redis CPU µs per fork, worker side, one at a time", fork_cpu, ""))
        waiter = statistics.median(step(f"Redis CPU a waiting scheduler adds, round {r + 1}",
                                        lambda: waiter_cpu_us(server, 50 if q else 300)) for r in range(rounds))
        rows.append(("Redis CPU µs a waiting sync scheduler adds per fork", waiter,
                     "Redis CPU µs per RQ SimpleWorker no-op job", noop_cpu, "≤ 0.25"))
        rows.append(("forks/s one primary carries at 100 % of a core (queue and registry on it, waiting schedulers)",
                     1e6 / (fork_cpu + waiter), "forks/s at a no-op job's cost", 1e6 / noop_cpu, ""))
        # The registry on a server of its own: each server's share, and the capacity they imply.
        rows.extend(step("queue server's and registry's shares", lambda: share_rows(server, cpu_jobs, rounds, waiter)))
        for w in (1, 2) if q else (1, 2, 4):  # --quick: one scaling step shows the rows work
            rate = step(f"{w} worker(s)", lambda w=w: fork_throughput(server, n, workers=w))  # type: ignore[misc]
            rows.append((f"single-fork requests/s, {w} worker process(es)", rate, "RQ SimpleWorker no-op jobs/s",
                         simple, ""))
        # Forks/s with 1 and 2 queue shards (own queue servers, this one the registry), 2 worker
        # processes in both, alternating rounds: a ratio, bounded by the machine's 2 cores.
        rows.extend(shard_rows(server, n, rounds, step=step))
        aio, seq = step("async client, 1,000 concurrent forks", lambda: async_vs_sync(server, 100 if q else 1000,
                                                                                    30 if q else 500))
        rows.append((f"async forks/s, {100 if q else 1000:,} concurrent, 4 workers", aio,
                     "sync client sequential forks/s, 4 workers", seq, ""))
        soak = None
        if args.soak > 0 and not q:
            from bench.soak import run_soak

            server.client().execute_command("FLUSHALL", "SYNC")  # type: ignore[no-untyped-call]
            soak = step(f"soak, {args.soak:.0f} s", lambda: run_soak(server.url, seconds=args.soak))
    return _report(args, rows, pings, soak, per_process)


def _report(args: argparse.Namespace, rows: list[tuple[str, float, str, float | None, str]], pings: float,
            soak: Any, per_process: dict[str, peers.Drain] | None = None) -> int:
    figures = [{"figure": r[0], "value": r[1], "baseline": r[2], "baselineValue": r[3],
                "ratio": (r[1] / r[3]) if r[3] else None, "bar": r[4]} for r in rows]
    print(f"\nRQ {rq.__version__}\n")
    print("\n".join(table(figures)))
    if per_process:
        print(f"\n{peers.render(per_process)}")
    if soak is not None:
        print(f"\nsoak ({args.soak:.0f} s, 4 workers, 2 schedulers, 2 appenders):\n{soak.render()}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"quick": args.quick, "rq": rq.__version__, "figures": figures, "ping_per_s": pings}
    if per_process:  # each system's per-process figures (medians), and the releases measured
        result["perProcess"] = {"versions": peers.versions(),
                                "systems": {s: dataclasses.asdict(d) for s, d in per_process.items()}}
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    print(f"\nfigures written to {out / 'bench.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
