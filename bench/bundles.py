"""Bundles: ``python -m bench.bundles [--sessions N] [--events E]``, export and import rates and memory.

A subtree of ``sessions`` sessions (a root and its children, each with ``events / sessions`` events
of its own, about 200 bytes each) is made on one throwaway server; it is exported to a file
(``ops.bundles.export_bundle``) and that file imported into a second, empty server
(``import_bundle``), each timed alone (wall clock, this process and the servers on one machine).
Memory: the peak of this process's Python allocations during each (``tracemalloc``, in a second
run: tracing slows allocation, so the rates come from the first), against the bundle's size: export
holds a page of events, import a page and the ids, never a log.
Prints one JSON object: ``exportEventsPerS``, ``importEventsPerS``, ``exportPeakBytes``,
``importPeakBytes``, ``bundleBytes``, ``sessions``, ``events``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from redis import Redis

from sessionfork.core import forks
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import bundles


def subtree(registry: Registry, sessions: int, events: int) -> str:
    """A root and ``sessions - 1`` children, ``events`` events spread over them (finished turns)."""
    per = max(4, events // sessions // 4 * 4)

    def fill(sid: str) -> None:
        batch = []
        for t in range(per // 4):
            batch += [NewEvent("turn/start", {"turn": t}), NewEvent("user/message", {"text": "q" * 120}),
                      NewEvent("assistant/message", {"text": "a" * 120}), NewEvent("turn/end", {"turn": t})]
            if len(batch) >= 1000:
                registry.append(sid, batch)
                batch = []
        if batch:
            registry.append(sid, batch)

    registry.create("bundle-root")
    fill("bundle-root")
    children = [f"bundle-child-{i}" for i in range(sessions - 1)]
    forks.fork_many(registry, "bundle-root", children)
    for child in children:
        fill(child)
    return "bundle-root"


def measure(sessions: int, events: int) -> dict[str, Any]:
    with EmbeddedServer() as source, EmbeddedServer() as target, tempfile.TemporaryDirectory() as folder:
        here, there = Registry(Redis(port=source.port)), Registry(Redis(port=target.port))
        root = subtree(here, sessions, events)
        path = Path(folder) / "subtree.bundle"
        figures: dict[str, Any] = {}
        for traced in (False, True):  # timed untraced (tracemalloc slows allocation), then traced
            there.redis.flushall()
            if traced:
                tracemalloc.start()
            started = time.perf_counter()
            with open(path, "wb") as out:
                manifest = bundles.export_bundle(here, root, out)
            exported = time.perf_counter() - started
            if traced:
                figures["exportPeakBytes"] = tracemalloc.get_traced_memory()[1]
                tracemalloc.reset_peak()
            started = time.perf_counter()
            done = bundles.import_bundle(there, path)
            imported = time.perf_counter() - started
            assert done.written == len(manifest.sessions), done
            if traced:
                figures["importPeakBytes"] = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            else:
                figures.update(exportEventsPerS=round(manifest.events / exported),
                               importEventsPerS=round(done.events / imported))
        return {"sessions": len(manifest.sessions), "events": manifest.events, "bundleBytes": path.stat().st_size,
                **figures}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bundles", description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.sessions, args.events)))


if __name__ == "__main__":
    main()
