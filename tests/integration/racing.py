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


def fork_repeatedly(registry: Any, source: str, worker: int, count: int, gate: Any) -> dict[str, list[str]]:
    """Fork ``source`` ``count`` times once ``gate`` opens; children created and those OPEN_TURN."""
    from sessionfork.core import forks
    from sessionfork.core.errors import ErrorCode

    created: list[str] = []
    open_turns: list[str] = []
    gate.wait(TIMEOUT)
    for i in range(count):
        child = f"child-{worker}-{i}"
        try:
            forks.fork(registry, source, child)
        except ForkError as exc:
            if exc.code is not ErrorCode.OPEN_TURN:
                raise
            open_turns.append(child)
        else:
            created.append(child)
    return {"created": created, "open_turns": open_turns}


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
