"""Races between OS processes: spawn them, release them together, collect what each reported.

Worker bodies live at module level in the test modules (``spawn`` children import them) and report
through ``report`` (or ``report_on``: a Registry of its own, released by the gate). A fork/append race
is made certain with the ``STARTED``/``DONE`` counters: forkers count each fork (``counted``), and the
appender waits after an append until a fork begun after it has finished (``a_later_fork``).
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import pytest
from redis import Redis
from redis.cluster import RedisCluster
from waits import wait_until

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry

TIMEOUT = 60.0


def report(results: Any, name: str, body: Callable[[], Any]) -> None:
    """Run ``body`` in a spawned process and put ``(name, status, value)`` on ``results``."""
    try:
        results.put((name, "ok", body()))
    except ForkError as exc:
        results.put((name, "fork-error", exc))
    except BaseException:
        results.put((name, "crash", traceback.format_exc()))


@contextmanager
def registry_at(address: int | str, *, cluster: bool = False) -> Iterator[Registry]:
    """A Registry on a connection of its own (closed after): to the server on port ``address``, or at
    the URL ``address`` (``cluster``: a Redis Cluster node's)."""
    if isinstance(address, int):
        client: Any = Redis(port=address)
    else:
        client = RedisCluster.from_url(address) if cluster else Redis.from_url(address)
    try:
        yield Registry(client)
    finally:
        client.close()


def report_on(address: int | str, name: str, gate: Any, results: Any, body: Callable[[Registry], Any], *,
              cluster: bool = False) -> None:
    """``report`` as ``name`` what ``body(registry)`` returns, run once ``gate`` opens, with a Registry
    of its own (``registry_at(address)``)."""
    def run_body() -> Any:
        with registry_at(address, cluster=cluster) as registry:
            gate.wait(TIMEOUT)
            return body(registry)

    report(results, name, run_body)


STARTED, DONE, OVER = "race:forks-started", "race:forks-done", "race:appender-done"
"""Counters and flag that make a fork/append race certain to race (test keys, not sessionfork's)."""


@contextmanager
def counted(redis: Any) -> Iterator[None]:
    """Count one fork: ``STARTED`` before it, ``DONE`` after it (not when it raised)."""
    redis.incr(STARTED)
    yield
    redis.incr(DONE)


def a_later_fork(redis: Any, what: str) -> None:
    """Wait until a fork that started after this call has finished (``DONE`` passed ``STARTED`` now)."""
    started = int(redis.get(STARTED) or 0)
    wait_until(lambda: int(redis.get(DONE) or 0) > started, TIMEOUT, what)


def fork_repeatedly(registry: Registry, source: str, worker: int, count: int) -> dict[str, list[str]]:
    """Fork ``source`` at least ``count`` times and until the appender of ``append_in_lockstep`` is
    done; children created and those refused ``OPEN_TURN``."""
    created: list[str] = []
    open_turns: list[str] = []
    i = 0
    while i < count or not registry.redis.exists(OVER):
        child = f"child-{worker}-{i}"
        with counted(registry.redis):
            try:
                forks.fork(registry, source, child)
            except ForkError as exc:
                if exc.code is not ErrorCode.OPEN_TURN:
                    raise
                open_turns.append(child)
            else:
                created.append(child)
        i += 1
    return {"created": created, "open_turns": open_turns}


def append_in_lockstep(registry: Registry, source: str, events: Sequence[Any]) -> None:
    """Append ``events`` one per call; after each ``turn/start`` and ``turn/end``, wait until a fork
    started after it has finished, so that the race is certain to show: some fork meets an open
    turn, some child gets a seed strictly inside the final log. Then tell the forkers to stop."""
    for event in events:
        registry.append(source, [event])
        if event.type in ("turn/start", "turn/end"):
            a_later_fork(registry.redis, f"a fork after {event.type}")
    registry.redis.set(OVER, 1)


def check_turn_prefix_race(registry: Registry, results: dict[str, tuple[str, Any]], turns: int, forkers: int,
                           forks_per_forker: int) -> None:
    """The checks of an ``append_in_lockstep`` appender (as ``appender``, ``turns`` turns of 4 events)
    racing ``fork_repeatedly`` forkers (as ``forker-<w>``): it raced (a fork met an open turn, a seed
    lies strictly inside the final log), and every child's seed is a whole-turn prefix of the source."""
    assert results["appender"] == ("ok", turns)
    created: list[str] = []
    refused: list[str] = []
    for value in succeeded(results, *(f"forker-{w}" for w in range(forkers))):
        assert len(value["created"]) + len(value["open_turns"]) >= forks_per_forker
        assert not any(registry.exists(c) for c in value["open_turns"])
        created += value["created"]
        refused += value["open_turns"]
    assert refused, "no fork met an open turn"
    assert any(0 < registry.header(c).seed_length < 4 * turns for c in created)  # type: ignore[operator]
    source = registry.events("src")
    assert len(source) == 4 * turns
    for child in created:
        header = registry.header(child)
        events = registry.events(child)
        assert header.parent_session == "src"
        assert len(events) == header.seed_length
        assert events == source[: header.seed_length], child
        assert not events or events[-1].type == "turn/end", child
    assert registry.children("src") == sorted(created)


@pytest.fixture(name="ctx")
def ctx_fixture() -> SpawnContext:
    return multiprocessing.get_context("spawn")


@pytest.fixture(name="spawned")
def spawned_fixture() -> Iterator[list[SpawnProcess]]:
    processes: list[SpawnProcess] = []
    yield processes
    for process in processes:  # only on failure: a process that outlived the test
        if process.is_alive():
            process.kill()
        process.join(TIMEOUT)
        process.close()


def run(ctx: SpawnContext, spawned: list[SpawnProcess],
        jobs: Sequence[tuple[Callable[..., None], tuple[Any, ...]]]) -> dict[str, tuple[str, Any]]:
    """Start one process per job, release them together, and collect ``name -> (status, value)``."""
    gate = ctx.Barrier(len(jobs))
    results = ctx.Queue()
    for target, args in jobs:
        process = ctx.Process(target=target, args=(*args, gate, results), daemon=True)
        spawned.append(process)
        process.start()
    collected: dict[str, tuple[str, Any]] = {}
    try:
        for _ in jobs:  # drain before join: a child blocks on exit until its queue data is read
            name, status, value = results.get(timeout=TIMEOUT)
            collected[name] = (status, value)
    except queue.Empty:
        pytest.fail(f"processes did not report within {TIMEOUT}s; got {sorted(collected)}")
    for process in spawned:
        process.join(TIMEOUT)
        assert process.exitcode == 0
    results.close()
    results.join_thread()
    crashes = {name: value for name, (status, value) in collected.items() if status == "crash"}
    assert not crashes, crashes
    return collected


def succeeded(results: dict[str, tuple[str, Any]], *names: str) -> list[Any]:
    """What each of ``names`` reported, each of which must have succeeded (any error is shown)."""
    for name in names:
        status, value = results[name]
        assert status == "ok", (name, value)
    return [results[name][1] for name in names]
