"""The soak test: ``python -m bench.soak [--seconds 60] [--redis-url URL]``.

``run_soak(url, seconds=...)`` loads a real worker fleet on one server (registry and queue alike):
``workers`` ``sessionfork worker`` processes; ``appenders`` processes appending whole turns to
``sources`` sessions (one event per call: a source is often inside an open turn); ``schedulers``
processes submitting single forks (caller's or generated id) and fan-outs of 4 through ``Client``,
at most ``WINDOW`` in flight each. After ``seconds`` it stops schedulers and appenders, waits until
every submitted request has an outcome (``TimeoutError`` otherwise; ``SoakError`` if a helper
crashed), SIGTERMs the workers (``worker_exit_codes``, 0 expected) and reports ``duplicates`` /
``lost`` (requests with more than one / no outcome stream entry), ``outcomes_by_code`` (those
entries per code: they add up to ``requests``), ``bad_seeds`` (children whose log is not their
parent's log cut at a turn/end, or empty) and ``bytes_per_child_*``: ``used_memory`` growth per
created child (client buffers and the sources' own logs excluded; children have no own events
here) over the first and the second half of the children (read back by ``bench.audit``).
``SoakReport.clean``: every check passed.

Deletion and retention run meanwhile (``bench.reaper``): the workers sweep with
``SESSIONFORK_RETENTION=1``, and a reaper process forks a grandchild of every other child, then
deletes the child or disposes it; ``deleted`` / ``swept`` count them, and ``bad_seeds`` includes
any grandchild whose log is no longer exactly its seed.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from bench import audit, reaper
from sessionfork.clients.client import Client
from sessionfork.core import keys, records, wire
from sessionfork.core.config import Settings
from sessionfork.core.factories import now_ms
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.worker.jobs import fresh_workers

TIMEOUT = 60.0
WINDOW = 16
FANOUT = 4
TURN_PAUSE = 0.005  # seconds an appender rests between turns: sources grow like agents' logs, not a flood


class SoakError(RuntimeError):
    """A helper process (appender or scheduler) crashed: the soak could not run to its checks."""


@dataclass(frozen=True)
class SoakReport:
    requests: int
    outcomes_by_code: dict[str, int]
    children: int
    duplicates: int
    lost: int
    bad_seeds: int
    bytes_per_child_first_half: float
    bytes_per_child_second_half: float
    seconds: float
    worker_exit_codes: list[int] = field(default_factory=list)
    deleted: int = 0  # children deleted by hand while the soak ran
    swept: int = 0  # children disposed while it ran, then deleted by the workers' retention sweep

    @property
    def clean(self) -> bool:
        return (not (self.duplicates or self.lost or self.bad_seeds or any(self.worker_exit_codes))
                and sum(self.outcomes_by_code.values()) == self.requests)

    def render(self) -> str:
        rows = [("seconds", f"{self.seconds:.1f}"), ("requests", self.requests),
                *((f"  {code}", n) for code, n in sorted(self.outcomes_by_code.items())),
                ("children", self.children), ("duplicates", self.duplicates), ("lost", self.lost),
                ("bad seeds", self.bad_seeds), ("bytes/child, 1st half", f"{self.bytes_per_child_first_half:.1f}"),
                ("bytes/child, 2nd half", f"{self.bytes_per_child_second_half:.1f}"),
                ("deleted by hand", self.deleted), ("swept by retention", self.swept),
                ("worker exit codes", " ".join(map(str, self.worker_exit_codes))),
                ("verdict", "clean" if self.clean else "FAILED")]
        return "\n".join(f"{label:<24}{value!s:>12}" for label, value in rows)


def _append_turns(url: str, sources: list[str], stop: Any) -> int:
    registry = Registry(Redis.from_url(url))
    turns = 0
    while not stop.is_set():  # checked between whole turns only: the sources end at a boundary
        for event in (NewEvent("turn/start", {"turn": turns}), NewEvent("user/message", {"text": f"q{turns}"}),
                      NewEvent("assistant/message", {"text": f"a{turns}"}), NewEvent("turn/end", {"turn": turns})):
            registry.append(sources[turns % len(sources)], [event])
        turns += 1
        stop.wait(TURN_PAUSE)
    return turns


def _submit_forks(url: str, sources: list[str], stop: Any) -> list[str]:
    client = Client(Redis.from_url(url))
    submitted: list[str] = []
    pending: collections.deque[wire.ForkRequest] = collections.deque()
    while not stop.is_set():
        n = len(submitted)
        request = client.request(sources[n % len(sources)], count=FANOUT if n % 3 == 2 else None,
                                 session_id=f"soak-{uuid.uuid4().hex}" if n % 3 == 0 else None)
        submitted.append(client.submit(request))
        pending.append(request)
        if len(pending) >= WINDOW:
            client.wait(pending.popleft(), TIMEOUT)
    return submitted


def _helper(role: str, url: str, sources: list[str], gate: Any, stop: Any, results: Any) -> None:
    """A spawned appender or scheduler: starts at ``gate``, runs until ``stop``, reports to ``results``."""
    try:
        gate.wait(TIMEOUT)
        if role == "reaper":
            results.put((role, reaper.reap(url, stop)))
            return
        body = _append_turns if role == "appender" else _submit_forks
        results.put((role, body(url, sources, stop)))
    except BaseException:
        results.put(("crash", traceback.format_exc()))


def stop_fleet(fleet: list[subprocess.Popen[bytes]]) -> list[int]:
    """SIGTERM every worker and reap it (SIGKILL after ``TIMEOUT``); their exit statuses."""
    for proc in fleet:
        proc.terminate()
    codes = []
    for proc in fleet:
        try:
            codes.append(proc.wait(TIMEOUT))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait(TIMEOUT))
    return codes


def _settle(redis: Redis, submitted: list[str]) -> None:
    """Wait until every request in ``submitted`` has a stored outcome (``TimeoutError`` at the deadline)."""
    waiting = list(submitted)

    def settled() -> bool:
        pipe = redis.pipeline(transaction=False)
        for rid in waiting:
            pipe.hmget(keys.request(rid), list(records.OUTCOME_MARKS))
        waiting[:] = [rid for rid, done in zip(waiting, pipe.execute(), strict=True) if not any(done)]
        return not waiting

    wait_until(settled, TIMEOUT, "every soak request to have an outcome", interval=0.05)


def run_soak(url: str, *, seconds: float, workers: int = 4, schedulers: int = 2, appenders: int = 2,
             sources: int = 4) -> SoakReport:
    """Run the soak described in the module docstring against the server at ``url``."""
    with Redis.from_url(url) as redis:
        registry, run, started_ms = Registry(redis), uuid.uuid4().hex[:8], now_ms()
        source_ids = [registry.create(f"soak-src-{run}-{i}").id for i in range(sources)]
        names = [f"soak-{run}-{i}" for i in range(workers)]
        env = {**os.environ, **reaper.RETENTION_ENV}
        fleet = [subprocess.Popen([sys.executable, "-m", "sessionfork", "--redis-url", url, "worker", "--name", n,
                                   "--log-level", "ERROR"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  env=env) for n in names]
        ctx = multiprocessing.get_context("spawn")
        jobs = [("appender", share) for share in (source_ids[i::appenders] for i in range(appenders)) if share]
        jobs += [("scheduler", source_ids)] * schedulers + [("reaper", source_ids)]
        gate, stop, results = ctx.Barrier(len(jobs) + 1), ctx.Event(), ctx.Queue()
        helpers = [ctx.Process(target=_helper, args=(role, url, share, gate, stop, results), daemon=True)
                   for role, share in jobs]
        submitted: list[str] = []
        reaped: dict[str, list[Any]] = {"deleted": [], "disposed": [], "grandchildren": []}
        try:
            for p in helpers:
                p.start()
            wait_until(lambda: set(names) <= set(fresh_workers(redis, Settings())), TIMEOUT, "soak workers")
            gate.wait(TIMEOUT)
            began = time.monotonic()
            samples = [audit.sample(redis, source_ids)]
            while time.monotonic() - began < seconds:
                stop.wait(min(1.0, max(0.1, seconds / 20)))  # pacing of the memory samples
                samples.append(audit.sample(redis, source_ids))
            stop.set()
            elapsed = time.monotonic() - began
            for _ in helpers:
                role, value = results.get(timeout=TIMEOUT)
                if role == "crash":
                    raise SoakError(f"a soak helper crashed:\n{value}")
                submitted += value if role == "scheduler" else []
                reaped = value if role == "reaper" else reaped
            for p in helpers:
                p.join(TIMEOUT)
            _settle(redis, submitted)
            samples.append(audit.sample(redis, source_ids))
            # The workers' retention sweep deletes what the reaper disposed (1 s retention, 1 s passes).
            wait_until(lambda: all(not registry.exists(c) for c in reaped["disposed"]), TIMEOUT,
                       "the retention sweep to delete the disposed children", interval=0.1)
        finally:
            stop.set()
            for p in helpers:
                if p.is_alive():  # only when something failed: the others have exited by now
                    p.kill()
                p.join(TIMEOUT)
            exit_codes = stop_fleet(fleet)
        per_request, by_code, created = audit.tally_outcomes(redis, set(submitted), started_ms)
        middle = min(samples, key=lambda s: abs(s[1] - samples[-1][1] / 2))
        gone = reaper.reaped_ids(reaped)
        parents = {p: registry.events(p) for p in source_ids}
        reaped_bad, swept = reaper.check(registry, parents, reaped)
        return SoakReport(
            requests=len(submitted), outcomes_by_code=dict(by_code), children=len(created),
            duplicates=sum(1 for n in per_request.values() if n > 1), lost=len(set(submitted) - set(per_request)),
            bad_seeds=audit.count_bad_seeds(registry, [h for h in created if h.id not in gone]) + reaped_bad,
            bytes_per_child_first_half=audit.bytes_per_child(samples[0], middle),
            bytes_per_child_second_half=audit.bytes_per_child(middle, samples[-1]), seconds=elapsed,
            worker_exit_codes=exit_codes, deleted=len(reaped["deleted"]), swept=swept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long schedulers submit (default 60)")
    parser.add_argument("--redis-url", help="server for registry and queue (default: start an embedded one)")
    for name, default in (("workers", 4), ("schedulers", 2), ("appenders", 2), ("sources", 4)):
        parser.add_argument(f"--{name}", type=int, default=default)
    options = vars(parser.parse_args(argv))
    url = options.pop("redis_url")
    if url:
        report = run_soak(url, **options)
    else:
        with EmbeddedServer() as server:
            report = run_soak(server.url, **options)
    print(report.render())
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
