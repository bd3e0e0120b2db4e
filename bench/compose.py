"""Composed forks (issue 19): a fork with edits and a summary fork, measured as ``measure.fork_cost``
measures a plain one."""

from __future__ import annotations

import statistics
import time

from bench.measure import _dataset_bytes, _fresh, _session_with
from sessionfork.core import forks
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent, Summary
from sessionfork.embedded import EmbeddedServer


def edit_fork_cost(server: EmbeddedServer, events: int, children: int) -> tuple[float, float]:
    """Median µs per fork with 2 edits (registry only) and Redis bytes per child less the edits'
    own stored bytes, for a parent of ``events``."""
    redis = _fresh(server)
    registry = Registry(redis)
    _session_with(registry, "parent", events)
    edits = [NewEvent("turn/start", {"turn": 99, "trigger": "user"}), NewEvent("user/message", {"text": "retry"})]
    own = sum(len(raw) for raw in registry.encode_events(edits, int(time.time() * 1000)))
    for i in range(50):  # warm up, as in fork_cost
        forks.fork(registry, "parent", f"warm-{i}", edits=edits)
    before = _dataset_bytes(redis)
    times = []
    for i in range(children):
        t = time.perf_counter()
        forks.fork(registry, "parent", f"child-{i}", edits=edits)
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times), (_dataset_bytes(redis) - before) / children - own


def summary_fork_cost(server: EmbeddedServer, events: int, children: int) -> tuple[float, float]:
    """Median µs per summary fork keeping the last turn of a parent of ``events`` (whole 4-event
    turns; registry only), and Redis bytes per child less its summary event's own stored bytes."""
    redis = _fresh(server)
    registry = Registry(redis)
    _session_with(registry, "parent", events)
    length = registry.length("parent")
    summary = Summary(keep_from=length - 4, data={"text": "everything before the last turn, summarised"})
    own = len(registry.summary_event("parent", summary, int(time.time() * 1000)))
    for i in range(50):  # warm up, as in fork_cost
        forks.fork(registry, "parent", f"warm-{i}", summary=summary)
    before = _dataset_bytes(redis)
    times = []
    for i in range(children):
        t = time.perf_counter()
        forks.fork(registry, "parent", f"child-{i}", summary=summary)
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times), (_dataset_bytes(redis) - before) / children - own
