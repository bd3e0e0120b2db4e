"""The soak test: ``python -m sessionfork.soak [--seconds 60] [--redis-url URL]``.

``run_soak(url, seconds=...)`` loads a real worker fleet on one server (registry and queue): it starts
``workers`` ``sessionfork worker`` processes; ``appenders`` processes appending whole turns (one
event per call, so a source is often inside an open turn) to ``sources`` sessions; ``schedulers``
processes submitting fork requests through ``Client`` (single forks, with a caller's or a generated
id, and fan-outs of 4; at most ``WINDOW`` in flight each). After ``seconds`` it stops schedulers and
appenders, waits until every submitted request has an outcome, SIGTERMs the workers and reports:

* ``duplicates`` / ``lost``: requests with more than one / no entry in the outcome stream, and
  ``outcomes_by_code``: those entries per code (adding up to ``requests`` when all is well);
* ``bad_seeds``: created children whose log is not their parent's log cut at a turn/end (or empty);
* ``bytes_per_child_*``: growth of ``used_memory`` per created child over the first and the second
  half of the children (client buffers and the sources' own logs excluded; the children have no
  own events here): flat memory per child means the two are close.

``SoakError`` when a helper process crashes or outcomes do not all come in time; ``worker_exit_codes``
holds the workers' exit statuses (0 expected); ``SoakReport.clean`` means every check passed.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from . import keys, wire
from .client import Client
from .config import Settings
from .embedded import EmbeddedServer, wait_until
from .registry import Registry, now_ms
from .wire import ForkResult, Header, NewEvent
from .workers import fresh_workers

TIMEOUT = 60.0
WINDOW = 16
FANOUT = 4
TURN_PAUSE = 0.005
"""Seconds an appender rests between turns: sources grow like agents' logs, not like a flood."""


class SoakError(RuntimeError):
    """The soak could not run to its checks (a crashed helper, outcomes that never came)."""


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

    @property
    def clean(self) -> bool:
        return (not (self.duplicates or self.lost or self.bad_seeds or any(self.worker_exit_codes))
                and sum(self.outcomes_by_code.values()) == self.requests)

    def render(self) -> str:
        rows = [("seconds", f"{self.seconds:.1f}"), ("requests", str(self.requests))]
        rows += [(f"  {code}", str(n)) for code, n in sorted(self.outcomes_by_code.items())]
        rows += [("children", str(self.children)), ("duplicates", str(self.duplicates)), ("lost", str(self.lost)),
                 ("bad seeds", str(self.bad_seeds)),
                 ("bytes/child, 1st half", f"{self.bytes_per_child_first_half:.1f}"),
                 ("bytes/child, 2nd half", f"{self.bytes_per_child_second_half:.1f}"),
                 ("worker exit codes", " ".join(map(str, self.worker_exit_codes))),
                 ("verdict", "clean" if self.clean else "FAILED")]
        return "\n".join(f"{label:<24}{value:>12}" for label, value in rows)


def _turn(n: int) -> list[NewEvent]:
    return [NewEvent("turn/start", {"turn": n}), NewEvent("user/message", {"text": f"question {n}"}),
            NewEvent("assistant/message", {"text": f"answer {n}"}), NewEvent("turn/end", {"turn": n})]


def _appender(url: str, sources: list[str], index: int, gate: Any, stop: Any, results: Any) -> None:
    try:
        registry = Registry(Redis.from_url(url))
        gate.wait(TIMEOUT)
        turns = 0
        while not stop.is_set():  # checked between whole turns only: sources end at a boundary
            source = sources[turns % len(sources)]
            for event in _turn(turns):
                registry.append(source, [event])
            turns += 1
            stop.wait(TURN_PAUSE)
        results.put(("appender", index, turns))
    except BaseException:
        results.put(("crash", index, traceback.format_exc()))


def _scheduler(url: str, sources: list[str], index: int, gate: Any, stop: Any, results: Any) -> None:
    try:
        client = Client(Redis.from_url(url))
        submitted: list[str] = []
        pending: collections.deque[wire.ForkRequest] = collections.deque()
        gate.wait(TIMEOUT)
        while not stop.is_set():
            n = len(submitted)
            source = sources[n % len(sources)]
            kind = n % 3
            request = client.request(source, session_id=f"soak-{uuid.uuid4().hex}" if kind == 0 else None,
                                     count=FANOUT if kind == 2 else None)
            submitted.append(client.submit(request))
            pending.append(request)
            if len(pending) >= WINDOW:
                client.wait(pending.popleft(), TIMEOUT)
        results.put(("scheduler", index, submitted))
    except BaseException:
        results.put(("crash", index, traceback.format_exc()))


def _memory(redis: Redis, sources: list[str]) -> int:
    info = redis.info("memory")
    own = sum(int(redis.memory_usage(keys.session_log(s), samples=0) or 0) for s in sources)
    return int(info["used_memory"]) - int(info.get("mem_clients_normal", 0)) - own


def _children(redis: Redis, sources: list[str]) -> int:
    return sum(int(redis.scard(keys.session_children(s))) for s in sources)


def _per_child(a: tuple[int, int], b: tuple[int, int]) -> float:
    return (b[0] - a[0]) / (b[1] - a[1]) if b[1] > a[1] else 0.0


def _bad_seeds(registry: Registry, created: list[Header]) -> int:
    """Children whose events are not their parent's prefix up to a turn/end (or empty)."""
    parents = {p: registry.events(p) for p in {h.parent_session for h in created} if isinstance(p, str)}
    # A child's events are a function of its record (len, seedlen, seed) and immutable ancestor logs:
    # read them once per distinct record, and compare every child's record with that one.
    pipe = registry.redis.pipeline(transaction=False)
    for header in created:
        pipe.hmget(keys.session(header.id), ["len", "seedlen", "seed"])
        pipe.exists(keys.session_log(header.id))
    raw = pipe.execute()
    verdicts: dict[tuple[Any, ...], bool] = {}
    bad = 0
    for i, header in enumerate(created):
        record, own_log = tuple(raw[2 * i]), raw[2 * i + 1]
        parent, seed = header.parent_session, header.seed_length
        if not isinstance(parent, str) or parent not in parents or not isinstance(seed, int) or own_log:
            bad += 1
            continue
        signature = (parent, seed, *record)
        if signature not in verdicts:
            events, source = registry.events(header.id), parents[parent]
            verdicts[signature] = (len(events) == seed and events == source[:seed]
                                   and (seed == 0 or events[-1].type == "turn/end"))
        bad += not verdicts[signature]
    return bad


def _outcomes(redis: Redis, mine: set[str], since_ms: int
              ) -> tuple[collections.Counter[str], collections.Counter[str], list[Header]]:
    """Outcome stream entries of ``mine`` per request and per code, and the children they created."""
    per_request: collections.Counter[str] = collections.Counter()
    by_code: collections.Counter[str] = collections.Counter()
    created: list[Header] = []
    entries: list[Any] = redis.xrange(keys.OUTCOME_STREAM, min=f"{since_ms}-0") or []
    for _, entry in entries:
        rid = entry[b"request"].decode()
        if rid in mine:
            per_request[rid] += 1
            by_code[entry[b"code"].decode()] += 1
            reply = wire.decode_reply(entry[b"reply"])
            if isinstance(reply, ForkResult):
                created += [reply.session] if isinstance(reply.session, Header) else []
                created += reply.sessions if isinstance(reply.sessions, list) else []
    return per_request, by_code, created


def _stop(fleet: list[subprocess.Popen[bytes]]) -> list[int]:
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


def run_soak(url: str, *, seconds: float, workers: int = 4, schedulers: int = 2, appenders: int = 2,
             sources: int = 4) -> SoakReport:
    """Run the soak described in the module docstring against the server at ``url``."""
    redis = Redis.from_url(url)
    registry = Registry(redis)
    run = uuid.uuid4().hex[:8]
    started_ms = now_ms()
    source_ids = [f"soak-src-{run}-{i}" for i in range(sources)]
    for sid in source_ids:
        registry.create(sid)
    names = [f"soak-{run}-{i}" for i in range(workers)]
    fleet = [subprocess.Popen([sys.executable, "-m", "sessionfork", "--redis-url", url, "worker", "--name", name,
                               "--log-level", "ERROR"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
             for name in names]
    ctx = multiprocessing.get_context("spawn")
    shares = [share for share in (source_ids[i::appenders] for i in range(appenders)) if share]
    gate, stop, results = ctx.Barrier(len(shares) + schedulers + 1), ctx.Event(), ctx.Queue()
    helpers = [ctx.Process(target=_appender, args=(url, share, i, gate, stop, results), daemon=True)
               for i, share in enumerate(shares)]
    helpers += [ctx.Process(target=_scheduler, args=(url, source_ids, i, gate, stop, results), daemon=True)
                for i in range(schedulers)]
    for p in helpers:
        p.start()
    try:
        wait_until(lambda: set(names) <= set(fresh_workers(redis, Settings())), TIMEOUT, "soak workers to register")
        gate.wait(TIMEOUT)
        began = time.monotonic()
        samples = [(_memory(redis, source_ids), _children(redis, source_ids))]
        interval = min(1.0, max(0.1, seconds / 20))
        while time.monotonic() - began < seconds:
            stop.wait(interval)  # pacing of the memory samples, not synchronisation
            samples.append((_memory(redis, source_ids), _children(redis, source_ids)))
        stop.set()
        submitted: list[str] = []
        for _ in helpers:
            kind, index, value = results.get(timeout=TIMEOUT)
            if kind == "crash":
                raise SoakError(f"soak helper {index} crashed:\n{value}")
            if kind == "scheduler":
                submitted += value
        for p in helpers:
            p.join(TIMEOUT)
        elapsed = time.monotonic() - began
        waiting = list(submitted)

        def settled() -> bool:
            nonlocal waiting
            pipe = redis.pipeline(transaction=False)
            for rid in waiting:
                pipe.hexists(keys.request(rid), "outcome")
            waiting = [rid for rid, done in zip(waiting, pipe.execute(), strict=True) if not done]
            return not waiting

        try:
            wait_until(settled, TIMEOUT, "every soak request to have an outcome", interval=0.05)
        except TimeoutError as exc:
            raise SoakError(f"{len(waiting)} request(s) without an outcome, e.g. {waiting[:3]}") from exc
        samples.append((_memory(redis, source_ids), _children(redis, source_ids)))
    finally:
        stop.set()
        for p in helpers:
            if p.is_alive():
                p.kill()
            p.join(TIMEOUT)
        exit_codes = _stop(fleet)
    per_request, by_code, created = _outcomes(redis, set(submitted), started_ms)
    half = samples[-1][1] / 2
    middle = min(samples, key=lambda s: abs(s[1] - half))
    report = SoakReport(
        requests=len(submitted), outcomes_by_code=dict(by_code), children=len(created),
        duplicates=sum(1 for n in per_request.values() if n > 1), lost=len(set(submitted) - set(per_request)),
        bad_seeds=_bad_seeds(registry, created), bytes_per_child_first_half=_per_child(samples[0], middle),
        bytes_per_child_second_half=_per_child(middle, samples[-1]), seconds=elapsed, worker_exit_codes=exit_codes)
    redis.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sessionfork.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long schedulers submit (default 60)")
    parser.add_argument("--redis-url", help="server for registry and queue (default: start an embedded one)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--appenders", type=int, default=2)
    parser.add_argument("--sources", type=int, default=4)
    args = parser.parse_args(argv)
    options = {"seconds": args.seconds, "workers": args.workers, "schedulers": args.schedulers,
               "appenders": args.appenders, "sources": args.sources}
    if args.redis_url:
        report = run_soak(args.redis_url, **options)
    else:
        with EmbeddedServer() as server:
            report = run_soak(server.url, **options)
    print(report.render())
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
