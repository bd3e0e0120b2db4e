"""Races of appends against boundary forks, between OS processes on one real server: a fork at the
last completed turn read a moment before always succeeds, and every seed is exactly the prefix asked."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from racing import ctx_fixture, report, run, spawned_fixture  # noqa: F401  (fixtures: ctx, spawned)
from redis import Redis

from sessionfork.core import forks
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer

TIMEOUT = 60.0
TURNS = 40
FORKERS = 3
FORKS_PER_WORKER = 40


def _appender(port: int, source: str, gate: Any, results: Any) -> None:
    def body() -> int:
        client = Redis(port=port)
        try:
            registry = Registry(client)
            gate.wait(TIMEOUT)
            for n in range(TURNS):  # one event per call: the source is mostly inside a running turn
                for event in (NewEvent("turn/start", {"n": n}), NewEvent("tool/call", {"id": f"t{n}"}),
                              NewEvent("tool/result", {"id": f"t{n}"}), NewEvent("turn/end", {"n": n}),
                              NewEvent("todo/write", {"n": n})):
                    registry.append(source, [event])
            return TURNS
        finally:
            client.close()

    report(results, "appender", body)


def _boundary_forker(port: int, source: str, worker: int, gate: Any, results: Any) -> None:
    def body() -> dict[str, Any]:
        client = Redis(port=port)
        try:
            registry = Registry(client)
            made: list[tuple[str, int]] = []
            early = 0
            gate.wait(TIMEOUT)
            for i in range(FORKS_PER_WORKER):
                boundary = registry.last_turn_end(source)  # O(1); the append goes on meanwhile
                if boundary is None:
                    early += 1
                    continue
                # Every other fork one seq later: the todo/write after the turn/end, between turns
                # too, once it exists (the source only grows, so the length read first is safe).
                if i % 2 and registry.length(source) > boundary + 1:
                    boundary += 1
                child = f"b-{worker}-{i}"
                forks.fork(registry, source, child, boundary=boundary)  # never INVALID_BOUNDARY
                made.append((child, boundary))
            return {"made": made, "early": early}
        finally:
            client.close()

    report(results, f"forker-{worker}", body)


def test_boundary_forks_racing_appends_take_exactly_the_requested_prefix(
    server: EmbeddedServer, registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    registry.create("src")
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(_appender, (server.port, "src"))]
    jobs += [(_boundary_forker, (server.port, "src", w)) for w in range(FORKERS)]
    results = run(ctx, spawned, jobs)

    assert results["appender"] == ("ok", TURNS)
    made: list[tuple[str, int]] = []
    for w in range(FORKERS):
        status, value = results[f"forker-{w}"]
        assert status == "ok", value  # a fork-error would be reported as such: none happened
        assert len(value["made"]) + value["early"] == FORKS_PER_WORKER
        made += value["made"]
    assert made

    source_events = registry.events("src")
    assert len(source_events) == 5 * TURNS
    for child, boundary in made:
        header = registry.header(child)
        events = registry.events(child)
        assert (header.parent_session, header.seed_length) == ("src", boundary + 1), child
        assert events == source_events[: boundary + 1], child
        assert events[-1].type in ("turn/end", "todo/write"), child
        assert registry.last_turn_end(child) == max(e.seq for e in events if e.type == "turn/end")
    assert registry.children("src") == sorted(c for c, _ in made)
    assert registry.last_turn_end("src") == 5 * TURNS - 2
