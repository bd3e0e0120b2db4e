"""Races of appends against boundary forks, between OS processes on one real server: a fork at the
last completed turn read a moment before always succeeds, and every seed is exactly the prefix asked.

The race is made certain and asserted: after each ``turn/start`` the appender waits until a fork
that started after it has finished (``racing.a_later_fork``), so some fork meets an open turn
and some boundary lies below the final ``last_turn_end``; the test checks both happened."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from racing import OVER, a_later_fork, counted, report_on, run, succeeded

from sessionfork.core import forks
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer

TURNS = 40
FORKERS = 3
FORKS_PER_WORKER = 40


def _appender(port: int, source: str, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> int:
        for n in range(TURNS):  # one event per call: the source is mostly inside a running turn
            for event in (NewEvent("turn/start", {"n": n}), NewEvent("tool/call", {"id": f"t{n}"}),
                          NewEvent("tool/result", {"id": f"t{n}"}), NewEvent("turn/end", {"n": n}),
                          NewEvent("todo/write", {"n": n})):
                registry.append(source, [event])
                if event.type == "turn/start":  # a turn is open: wait for a fork to meet it
                    a_later_fork(registry.redis, "a fork started inside the open turn")
        registry.redis.set(OVER, 1)
        return TURNS

    report_on(port, "appender", gate, results, body)


def _boundary_forker(port: int, source: str, worker: int, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> dict[str, Any]:
        client = registry.redis
        made: list[tuple[str, int, int]] = []
        early = 0
        i = 0
        while i < FORKS_PER_WORKER or not client.exists(OVER):
            i += 1
            with counted(client):
                seen = registry.length(source)  # the source had at least this many events at the fork
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
            made.append((child, boundary, seen))
        return {"made": made, "early": early}

    report_on(port, f"forker-{worker}", gate, results, body)


def test_boundary_forks_racing_appends_take_exactly_the_requested_prefix(
    server: EmbeddedServer, registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    registry.create("src")
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(_appender, (server.port, "src"))]
    jobs += [(_boundary_forker, (server.port, "src", w)) for w in range(FORKERS)]
    results = run(ctx, spawned, jobs)

    assert results["appender"] == ("ok", TURNS)
    made: list[tuple[str, int, int]] = []
    # a fork-error would be reported as such: none happened
    for value in succeeded(results, *(f"forker-{w}" for w in range(FORKERS))):
        assert len(value["made"]) + value["early"] >= FORKS_PER_WORKER
        made += [tuple(m) for m in value["made"]]
    assert made

    source_events = registry.events("src")
    assert len(source_events) == 5 * TURNS
    final = registry.last_turn_end("src")
    # The interleavings this test is about happened: a fork met an open turn (the source had a
    # turn/start after the boundary, whose turn/end came later), and forks ran mid-append.
    open_turn = [c for c, b, seen in made if any(
        e.type == "turn/start" and all(x.type != "turn/end" for x in source_events[e.seq:seen])
        for e in source_events[b + 1:seen])]
    assert open_turn, "no fork met an open turn"
    assert len({b for _, b, _ in made if final is not None and b < final}) >= TURNS // 2
    for child, boundary, _ in made:
        header = registry.header(child)
        events = registry.events(child)
        assert (header.parent_session, header.seed_length) == ("src", boundary + 1), child
        assert events == source_events[: boundary + 1], child
        assert events[-1].type in ("turn/end", "todo/write"), child
        assert registry.last_turn_end(child) == max(e.seq for e in events if e.type == "turn/end")
    assert registry.children("src") == sorted(c for c, _, _ in made)
    assert registry.last_turn_end("src") == 5 * TURNS - 2
