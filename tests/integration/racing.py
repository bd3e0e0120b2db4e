"""Races between OS processes: spawn them, release them together, collect what each reported.

Worker bodies live at module level in the test modules (``spawn`` children import them) and report
through ``report``.
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import pytest

from sessionfork.core.errors import ForkError

TIMEOUT = 60.0


def report(results: Any, name: str, body: Callable[[], Any]) -> None:
    """Run ``body`` in a spawned process and put ``(name, status, value)`` on ``results``."""
    try:
        results.put((name, "ok", body()))
    except ForkError as exc:
        results.put((name, "fork-error", exc))
    except BaseException:
        results.put((name, "crash", traceback.format_exc()))


STARTED, DONE, OVER = "race:forks-started", "race:forks-done", "race:appender-done"
"""Counters and flag that make a fork/append race certain to race (test keys, not sessionfork's)."""


def fork_repeatedly(registry: Any, source: str, worker: int, count: int, gate: Any) -> dict[str, list[str]]:
    """Fork ``source`` once ``gate`` opens, at least ``count`` times and until the appender of
    ``append_in_lockstep`` is done; children created and those refused ``OPEN_TURN``."""
    from sessionfork.core import forks
    from sessionfork.core.errors import ErrorCode

    created: list[str] = []
    open_turns: list[str] = []
    gate.wait(TIMEOUT)
    i = 0
    while i < count or not registry.redis.exists(OVER):
        child = f"child-{worker}-{i}"
        registry.redis.incr(STARTED)
        try:
            forks.fork(registry, source, child)
        except ForkError as exc:
            if exc.code is not ErrorCode.OPEN_TURN:
                raise
            open_turns.append(child)
        else:
            created.append(child)
        registry.redis.incr(DONE)
        i += 1
    return {"created": created, "open_turns": open_turns}


def append_in_lockstep(registry: Any, source: str, events: Sequence[Any]) -> None:
    """Append ``events`` one per call; after each ``turn/start`` and ``turn/end``, wait until a fork
    started after it has finished, so that the race is certain to show: some fork meets an open
    turn, some child gets a seed strictly inside the final log. Then tell the forkers to stop."""
    from sessionfork.embedded import wait_until

    for event in events:
        registry.append(source, [event])
        if event.type in ("turn/start", "turn/end"):
            started = int(registry.redis.get(STARTED) or 0)
            # done > started-so-far: at least one finished fork began after this append
            wait_until(lambda s=started: int(registry.redis.get(DONE) or 0) > s, TIMEOUT,
                       f"a fork after {event.type}")
    registry.redis.set(OVER, 1)


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
