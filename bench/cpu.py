"""The Redis CPU rows alone: ``python -m bench.cpu [--rounds N] [--jobs N] [--waits N]``.

The same measurements (``bench.redis_cost``) ``bench.main`` makes for its CPU rows (``redis_cpu_per_job``,
``steps_cpu_per_fork``, ``waiter_cpu_us``, ``round_trips``), alternating rounds, medians printed with
each round's figures: a quick way to compare two versions of the worker or the waiter without the whole bench.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.redis_cost import redis_cpu_per_job, round_trips, steps_cpu_per_fork, waiter_cpu_us
from sessionfork.embedded import EmbeddedServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.cpu", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per worker burst")
    parser.add_argument("--waits", type=int, default=300, help="requests per waiter round")
    args = parser.parse_args(argv)
    with EmbeddedServer() as server:
        ours_rt, one_rt, simple_rt = round_trips(server, 200)
        print(f"round trips per job: fork {ours_rt:.2f} in batches, {one_rt:.2f} one at a time, "
              f"SimpleWorker no-op {simple_rt:.2f}", flush=True)
        forks, batched, noops, waits, own = [], [], [], [], []
        for r in range(args.rounds):
            batched_us, fork_us, noop_us = redis_cpu_per_job(server, args.jobs)
            batched.append(batched_us)
            steps = steps_cpu_per_fork(server, args.jobs)
            waiter = waiter_cpu_us(server, args.waits)
            forks.append(fork_us)
            noops.append(noop_us)
            own.append(steps)
            waits.append(waiter)
            print(f"round {r + 1}: fork in batches {batched_us:.0f} µs ({batched_us / noop_us:.2f}x), "
                  f"one at a time {fork_us:.0f} µs, no-op {noop_us:.0f} µs ({fork_us / noop_us:.2f}x), "
                  f"own steps {steps:.0f} µs ({steps / noop_us:.2f}x), "
                  f"waiter {waiter:.0f} µs ({waiter / noop_us:.2f}x)", flush=True)
        batched_m, fork_m, noop_m, own_m, wait_m = (statistics.median(x) for x in (batched, forks, noops, own, waits))
        print(f"median: fork in batches {batched_m:.0f} µs, ratio {batched_m / noop_m:.2f}x; "
              f"one at a time {fork_m:.0f} µs, no-op {noop_m:.0f} µs, ratio {fork_m / noop_m:.2f}x; "
              f"own steps {own_m:.0f} µs, ratio {own_m / noop_m:.2f}x; "
              f"waiter {wait_m:.0f} µs, ratio {wait_m / noop_m:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
