"""sessionfork's forks (batches, the default; and one at a time) beside Dramatiq's, Huey's and RQ's
no-op jobs, per worker process:
``python -m bench.peers [--rounds N] [--jobs N]`` (``bench.main`` measures the same in its rounds).

Each system is measured alike (``drain``) on a throwaway server it is given, flushed first: its jobs
queued with no worker running, then one worker process (``bench.peer_runner``: sessionfork's
``worker --burst``, RQ's ``SimpleWorker``, Dramatiq's ``Worker`` and Huey's consumer with 8 threads
each) works them off. Between a snapshot of the server taken when the worker is ready and one taken
when it reports its last job done: the jobs per second (the worker's own clock, go → last job done),
the Redis commands per job (``INFO commandstats``: every call, those inside scripts included, less
the first snapshot's own ``INFO``), the server's CPU per job (``INFO cpu``: user + system) and the
worker process's CPU per job (its ``getrusage`` over the drain). The worker's clock stops at its
last job done (its own shutdown is not measured). Then every job is checked done, by its framework
and in Redis (``verify``); a run with a job not done raises.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from redis import Redis

from bench.measure import flushed
from bench.peer_runner import RQ_QUEUE, SYSTEMS, request_id
from sessionfork.core import keys, records
from sessionfork.core.settings import Settings
from sessionfork.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[1]
READY_WITHIN = 120.0  # seconds a worker process may take to import, or to queue its jobs and build its worker
DRAIN_WITHIN = 900.0  # seconds a drain may take (2,000 RQ no-op jobs on a loaded machine: ~60)

LABELS = {"sessionfork": f"sessionfork forks (batches of up to {Settings().batch}, the default)",
          "sessionfork-1": "sessionfork forks, one at a time (SESSIONFORK_BATCH=1)", "rq": "RQ SimpleWorker no-op",
          "dramatiq": "Dramatiq no-op (8 threads)",
          "huey": "Huey no-op (8 threads, no results)"}
PEERS = ("sessionfork-1", "dramatiq", "huey", "rq")
"""What each sessionfork figure (the default settings) is set against in ``rows``, in the table's
order: its own one-at-a-time worker (the batch default's measure), then the peers."""


@dataclass(frozen=True)
class Drain:
    """One system's drain by one worker process: jobs/s, and per job the Redis commands, the Redis
    server's CPU (µs) and the worker process's CPU (µs); ``rounds``: the drains it is the median of."""

    system: str
    jobs: int
    per_s: float
    commands: float
    redis_cpu_us: float
    worker_cpu_us: float
    rounds: int = 1


def server_totals(redis: Redis) -> tuple[int, float]:
    """The server's command calls so far (every ``cmdstat_``) and its CPU (µs), from one ``INFO``."""
    info: dict[str, Any] = redis.info("commandstats", "cpu")
    calls = sum(int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_"))
    return calls, (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


class _Lines:
    """A process's stdout lines, read by a thread of their own so that each can be awaited with a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()

        def read() -> None:
            for line in stream:
                self._lines.put(line)
            self._lines.put("")  # the end: the process closed its stdout (it exited)

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def expect(self, word: str, within: float, why: Callable[[], str]) -> list[str]:
        try:
            line = self._lines.get(timeout=within)
        except queue.Empty:
            raise TimeoutError(f"no {word!r} within {within:.0f}s: {why()}") from None
        if not line.startswith(word):
            raise RuntimeError(f"expected {word!r}, got {line!r}: {why()}")
        return line.split()

    def join(self) -> None:
        """Wait for the end of the stream (the process has exited): then it may be closed."""
        self._reader.join(10)


class Runner:
    """A ``bench.peer_runner`` process for ``system``, started (it imports, then says ``up``):
    ``drain`` runs it once. Several may be started at once, to import side by side, and drained in turn."""

    def __init__(self, server: EmbeddedServer, system: str, jobs: int) -> None:
        self.system, self.jobs = system, jobs
        self._err = tempfile.TemporaryFile("w+")  # noqa: SIM115 - the runner's to close (``close``)
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.peer_runner", system, server.url, str(jobs)],
                                     cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True)
        assert self.proc.stdout is not None
        self.lines = _Lines(self.proc.stdout)

    def why(self) -> str:
        """What the process said on stderr, and its exit status: for an error's message."""
        self._err.seek(0)
        return f"{self.system} worker (exit {self.proc.poll()}): {self._err.read()[-2000:]}"

    def tell(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{word}\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        """End the process (killed: its figures are in, nothing of its shutdown is measured) and
        close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.lines.join()
        for stream in (self.proc.stdin, self.proc.stdout, self._err):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def drain(server: EmbeddedServer, system: str, jobs: int, runner: Runner | None = None) -> Drain:
    """``jobs`` jobs of ``system`` queued on the flushed ``server``, then worked off by one worker
    process (``runner``: one started already for them; else started here)."""
    with runner or Runner(server, system, jobs) as run:
        redis = flushed(server)
        run.lines.expect("up", READY_WITHIN, run.why)
        run.tell("prepare")
        run.lines.expect("ready", READY_WITHIN, run.why)
        calls, cpu = server_totals(redis)
        run.tell("go")
        _, seconds, worker_cpu, count = run.lines.expect("done", DRAIN_WITHIN, run.why)
        calls_after, cpu_after = server_totals(redis)
        verify(system, redis, jobs, int(count))
    commands = calls_after - calls - 1  # less the first snapshot's INFO (the second counts it, not itself)
    return Drain(system, jobs, jobs / float(seconds), commands / jobs, (cpu_after - cpu) / jobs,
                 float(worker_cpu) / jobs)


def verify(system: str, redis: Redis, jobs: int, count: int) -> None:
    """Raise unless all ``jobs`` of a drained ``system`` are done: its framework reported each done
    (``count``), and each fork request has an OK outcome, RQ's registries hold every job finished
    and none failed, Dramatiq and Huey hold none pending."""
    if count != jobs:
        raise RuntimeError(f"{system}: {count} of {jobs} jobs reported done")
    if system.startswith("sessionfork"):
        pipe = redis.pipeline(transaction=False)
        for i in range(jobs):
            pipe.hmget(keys.request(request_id(i)), list(records.STORED_OUTCOME))
        replies = [records.decode_outcome(request_id(i), fields) for i, fields in enumerate(pipe.execute())]
        not_ok = [r for r in replies if r is None or not r.ok]
        if not_ok:
            raise RuntimeError(f"{len(not_ok)} of {jobs} fork requests without an OK outcome: {not_ok[:3]}")
        return
    if system == "rq":
        from rq.registry import FailedJobRegistry, FinishedJobRegistry

        finished = redis.zcard(FinishedJobRegistry(RQ_QUEUE, connection=redis).key)
        failed = redis.zcard(FailedJobRegistry(RQ_QUEUE, connection=redis).key)
        if (finished, failed) != (jobs, 0):
            raise RuntimeError(f"RQ: {finished} of {jobs} jobs finished, {failed} failed")
        return
    from bench.peer_jobs import pending

    left = pending(system, redis)
    if left:
        raise RuntimeError(f"{system}: {jobs} jobs reported done, {left} pending")


def one_round(server: EmbeddedServer, jobs: int, r: int, *, step: Callable[[str, Callable[[], Any]], Any]
              = lambda label, fn: fn()) -> dict[str, Drain]:
    """Every system drained once (round ``r``, 0-based), in turns: a change of the machine's load weighs
    on all. Their processes start at once (their imports overlap), each drained alone in its turn."""
    with contextlib.ExitStack() as stack:
        runners = [stack.enter_context(Runner(server, system, jobs)) for system in SYSTEMS]
        return {run.system: step(f"{LABELS[run.system]}, {jobs} queued first, 1 process, round {r + 1}",
                                 lambda run=run: drain(server, run.system, jobs, run))  # type: ignore[misc]
                for run in runners}


def medians(rounds: Sequence[dict[str, Drain]]) -> dict[str, Drain]:
    """Each system's figures, each the median over ``rounds``."""
    return {system: median([r[system] for r in rounds]) for system in rounds[0]}


def median(drains: Sequence[Drain]) -> Drain:
    """Each figure's median over ``drains`` (one system's rounds)."""
    per_s, commands, redis_cpu, worker_cpu = (statistics.median(getattr(d, f) for d in drains)
                                              for f in ("per_s", "commands", "redis_cpu_us", "worker_cpu_us"))
    return Drain(drains[0].system, drains[0].jobs, per_s, commands, redis_cpu, worker_cpu, rounds=len(drains))


ROW_FIGURES = (("per_s", "forks/s, one worker process, requests queued first (median of rounds)", "jobs/s"),
               ("commands", "Redis commands per fork, worker side (INFO commandstats)", "commands per job"),
               ("redis_cpu_us", "Redis CPU µs per fork, worker side, one process draining", "Redis CPU µs per job"),
               ("worker_cpu_us", "worker CPU µs per fork (the worker process's getrusage)", "worker CPU µs per job"))


def rows(figures: dict[str, Drain]) -> list[tuple[str, float, str, float | None, str]]:
    """The benchmark's rows: each sessionfork figure against each peer's (``PEERS``)."""
    ours = figures["sessionfork"]
    return [(figure, getattr(ours, field), f"{LABELS[peer]} {unit}", getattr(figures[peer], field), "")
            for field, figure, unit in ROW_FIGURES for peer in PEERS]


def versions() -> dict[str, str]:
    """The peers' releases measured (installed with the test extra, beside sessionfork)."""
    from importlib.metadata import version

    return {name: version(name) for name in ("rq", "dramatiq", "huey", "redis")}


def render(figures: dict[str, Drain]) -> str:
    """A markdown table of each system's figures (medians of rounds), one row each, headed by the versions."""
    first = next(iter(figures.values()))
    out = [f"One worker process per system, {first.jobs:,} jobs queued first, medians of {first.rounds} round(s); "
           + ", ".join(f"{name} {v}" for name, v in versions().items()) + ":", "",
           "| system (one worker process) | jobs/s | Redis commands/job | Redis CPU µs/job | worker CPU µs/job |",
           "|---|---:|---:|---:|---:|"]
    for system, d in figures.items():
        out.append(f"| {LABELS[system]} | {d.per_s:,.0f} | {d.commands:.1f} | {d.redis_cpu_us:,.0f} "
                   f"| {d.worker_cpu_us:,.0f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs queued per system and round")
    args = parser.parse_args(argv)
    with EmbeddedServer() as server:
        rounds = [one_round(server, args.jobs, r, step=lambda label, fn: print(f"… {label}", file=sys.stderr,
                                                                                flush=True) or fn())
                  for r in range(args.rounds)]
    for system in SYSTEMS:
        print(f"{LABELS[system]}: " + "; ".join(
            f"{d.per_s:,.0f}/s, {d.commands:.1f} cmds, {d.redis_cpu_us:,.0f} µs Redis, {d.worker_cpu_us:,.0f} µs worker"
            for d in (r[system] for r in rounds)))
    print(render(medians(rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
