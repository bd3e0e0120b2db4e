"""Composed forks: a fork with edits and a summary fork, measured as ``measure.fork_cost``
measures a plain one; what deleting a summary child's source frees."""

from __future__ import annotations

import time

from bench.measure import flushed, measured_forks, write_session
from sessionfork.core import forks, keys
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent, Summary
from sessionfork.embedded import EmbeddedServer


def edit_fork_cost(server: EmbeddedServer, events: int, children: int) -> tuple[float, float]:
    """Median µs per fork with 2 edits (registry only) and Redis bytes per child less the edits'
    own stored bytes, for a parent of ``events``."""
    redis = flushed(server)
    registry = Registry(redis)
    write_session(registry, "parent", events)
    edits = [NewEvent("turn/start", {"turn": 99, "trigger": "user"}), NewEvent("user/message", {"text": "retry"})]
    own = sum(len(raw) for raw in registry.encode_events(edits, int(time.time() * 1000)))
    for i in range(50):  # warm up, as in fork_cost
        forks.fork(registry, "parent", f"warm-{i}", edits=edits)
    median, per_child = measured_forks(redis, children, lambda i: forks.fork(registry, "parent", f"child-{i}",
                                                                              edits=edits))
    return median, per_child - own


def summary_fork_cost(server: EmbeddedServer, events: int, children: int) -> tuple[float, float]:
    """Median µs per summary fork keeping the last turn of a parent of ``events`` (whole 4-event
    turns; registry only), and Redis bytes per child less its summary event's own stored bytes."""
    redis = flushed(server)
    registry = Registry(redis)
    write_session(registry, "parent", events)
    length = registry.length("parent")
    summary = Summary(keep_from=length - 4, data={"text": "everything before the last turn, summarised"})
    own = len(registry.summary_event("parent", summary, int(time.time() * 1000)))
    for i in range(50):  # warm up, as in fork_cost
        forks.fork(registry, "parent", f"warm-{i}", summary=summary)
    median, per_child = measured_forks(redis, children, lambda i: forks.fork(registry, "parent", f"child-{i}",
                                                                              summary=summary))
    return median, per_child - own


def summary_source_freed(server: EmbeddedServer, events: int) -> tuple[float, float]:
    """Bytes (``MEMORY USAGE``) of a parent's log and turn index, ``events`` long (whole 4-event
    turns), with a summary child keeping its last turn: before the parent is deleted, and after
    (the child pins only its kept range; the rest is freed: docs/storage.md)."""
    redis = flushed(server)
    registry = Registry(redis)
    write_session(registry, "parent", events)
    forks.fork(registry, "parent", "child",
               summary=Summary(keep_from=registry.length("parent") - 4, data={"text": "summarised"}))

    def held() -> float:
        return float(sum(int(redis.memory_usage(key, samples=0) or 0)
                         for key in (keys.session_log("parent"), keys.session_turns("parent"))))

    before = held()
    registry.delete("parent")
    return before, held()
