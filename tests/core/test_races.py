"""Races between OS processes, each with its own connection and Registry, on one real server."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from racing import append_in_lockstep, check_turn_prefix_race, fork_repeatedly, report_on, run, succeeded

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer

TURNS = 40
FORKERS = 3
FORKS_PER_WORKER = 40
SAME_CHILD_FORKERS = 8
APPENDERS = 4
APPENDS_PER_WORKER = 150

# -- worker bodies (module level, so that "spawn" children can import them) -------------------------


def _turn_appender(port: int, source: str, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> int:
        append_in_lockstep(registry, source, [  # one event per call: the source is often in an open turn
            event for n in range(TURNS)
            for event in (NewEvent("turn/start", {"n": n}), NewEvent("user/message", {"n": n}),
                          NewEvent("assistant/message", {"n": n}),
                          NewEvent("turn/end", {"n": n, "reason": "completed"}))])
        return TURNS

    report_on(port, "appender", gate, results, body)


def _repeated_forker(port: int, source: str, worker: int, gate: Any, results: Any) -> None:
    report_on(port, f"forker-{worker}", gate, results,
              lambda registry: fork_repeatedly(registry, source, worker, FORKS_PER_WORKER))


def _same_child_forker(port: int, source: str, child: str, worker: int, gate: Any, results: Any) -> None:
    report_on(port, f"forker-{worker}", gate, results, lambda registry: forks.fork(registry, source, child))


def _appender(port: int, session: str, worker: int, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> list[int]:
        seqs: list[int] = []
        i = 0
        while i < APPENDS_PER_WORKER:
            size = 1 + (i + worker) % 3  # batches of 1-3 events
            batch = [NewEvent("tool/result", {"worker": worker, "i": i + k})
                     for k in range(min(size, APPENDS_PER_WORKER - i))]
            seqs.extend(e.seq for e in registry.append(session, batch))
            i += len(batch)
        return seqs

    report_on(port, f"appender-{worker}", gate, results, body)


# -- the races -------------------------------------------------------------------------------------


def test_concurrent_forks_of_a_source_in_mid_turn_take_whole_turn_prefixes(
    server: EmbeddedServer, registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    registry.create("src")
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(_turn_appender, (server.port, "src"))]
    jobs += [(_repeated_forker, (server.port, "src", w)) for w in range(FORKERS)]
    results = run(ctx, spawned, jobs)

    check_turn_prefix_race(registry, results, TURNS, FORKERS, FORKS_PER_WORKER)


def test_concurrent_forks_into_one_child_id_have_exactly_one_winner(
    server: EmbeddedServer, registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    registry.create("src")
    registry.append("src", [NewEvent("turn/start"), NewEvent("turn/end", {"reason": "completed"})])
    jobs = [(_same_child_forker, (server.port, "src", "child", w)) for w in range(SAME_CHILD_FORKERS)]
    results = run(ctx, spawned, jobs)

    winners = [value for status, value in results.values() if status == "ok"]
    losers = [value for status, value in results.values() if status == "fork-error"]
    assert len(winners) == 1
    assert len(losers) == SAME_CHILD_FORKERS - 1
    for error in losers:
        assert isinstance(error, ForkError)
        assert (error.code, error.message) == (
            ErrorCode.SESSION_ALREADY_EXISTS, 'session "child" already exists'
        )
    assert registry.header("child") == winners[0]
    assert registry.events("child") == registry.events("src")
    assert registry.children("src") == ["child"]


def test_concurrent_appends_get_gapless_unique_seqs(
    server: EmbeddedServer, registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    registry.create("shared")
    jobs = [(_appender, (server.port, "shared", w)) for w in range(APPENDERS)]
    results = run(ctx, spawned, jobs)

    total = APPENDERS * APPENDS_PER_WORKER
    returned: list[int] = []
    for seqs in succeeded(results, *(f"appender-{w}" for w in range(APPENDERS))):
        assert len(seqs) == APPENDS_PER_WORKER
        assert seqs == sorted(seqs)
        returned += seqs
    assert sorted(returned) == list(range(total))

    events = registry.events("shared")
    assert [e.seq for e in events] == list(range(total))
    assert registry.length("shared") == total
    for w in range(APPENDERS):
        mine = [e for e in events if e.data["worker"] == w]
        assert [e.data["i"] for e in mine] == list(range(APPENDS_PER_WORKER))
        assert [e.seq for e in mine] == results[f"appender-{w}"][1]
