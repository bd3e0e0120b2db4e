"""Races between OS processes, each with its own connection and Registry, on one real server."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from racing import append_in_lockstep, ctx_fixture, fork_repeatedly, report, run, spawned_fixture  # noqa: F401  (fixtures: ctx, spawned)
from redis import Redis

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Header, NewEvent
from sessionfork.embedded import EmbeddedServer

TIMEOUT = 60.0
TURNS = 40
FORKERS = 3
FORKS_PER_WORKER = 40
SAME_CHILD_FORKERS = 8
APPENDERS = 4
APPENDS_PER_WORKER = 150

# -- worker bodies (module level, so that "spawn" children can import them) -------------------------


def _turn_appender(port: int, source: str, gate: Any, results: Any) -> None:
    def body() -> int:
        client = Redis(port=port)
        try:
            registry = Registry(client)
            gate.wait(TIMEOUT)
            append_in_lockstep(registry, source, [  # one event per call: the source is often in an open turn
                event for n in range(TURNS)
                for event in (NewEvent("turn/start", {"n": n}), NewEvent("user/message", {"n": n}),
                              NewEvent("assistant/message", {"n": n}),
                              NewEvent("turn/end", {"n": n, "reason": "completed"}))])
            return TURNS
        finally:
            client.close()

    report(results, "appender", body)


def _repeated_forker(port: int, source: str, worker: int, gate: Any, results: Any) -> None:
    def body() -> dict[str, list[str]]:
        client = Redis(port=port)
        try:
            return fork_repeatedly(Registry(client), source, worker, FORKS_PER_WORKER, gate)
        finally:
            client.close()

    report(results, f"forker-{worker}", body)


def _same_child_forker(port: int, source: str, child: str, worker: int, gate: Any, results: Any) -> None:
    def body() -> Header:
        client = Redis(port=port)
        try:
            registry = Registry(client)
            gate.wait(TIMEOUT)
            return forks.fork(registry, source, child)
        finally:
            client.close()

    report(results, f"forker-{worker}", body)


def _appender(port: int, session: str, worker: int, gate: Any, results: Any) -> None:
    def body() -> list[int]:
        client = Redis(port=port)
        try:
            registry = Registry(client)
            seqs: list[int] = []
            gate.wait(TIMEOUT)
            i = 0
            while i < APPENDS_PER_WORKER:
                size = 1 + (i + worker) % 3  # batches of 1-3 events
                batch = [NewEvent("tool/result", {"worker": worker, "i": i + k})
                         for k in range(min(size, APPENDS_PER_WORKER - i))]
                seqs.extend(e.seq for e in registry.append(session, batch))
                i += len(batch)
            return seqs
        finally:
            client.close()

    report(results, f"appender-{worker}", body)


# -- the races -------------------------------------------------------------------------------------


def test_concurrent_forks_of_a_source_in_mid_turn_take_whole_turn_prefixes(
    server: EmbeddedServer, registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    registry.create("src")
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(_turn_appender, (server.port, "src"))]
    jobs += [(_repeated_forker, (server.port, "src", w)) for w in range(FORKERS)]
    results = run(ctx, spawned, jobs)

    assert results["appender"] == ("ok", TURNS)
    created: list[str] = []
    refused: list[str] = []
    for w in range(FORKERS):
        status, value = results[f"forker-{w}"]
        assert status == "ok", value
        created += value["created"]
        refused += value["open_turns"]
        assert len(value["created"]) + len(value["open_turns"]) >= FORKS_PER_WORKER
        assert not any(registry.exists(c) for c in value["open_turns"])
    # It raced: some fork met an open turn, some child's seed is strictly inside the final log.
    assert refused
    assert any(0 < registry.header(c).seed_length < 4 * TURNS for c in created)  # type: ignore[operator]

    source_events = registry.events("src")
    assert len(source_events) == 4 * TURNS
    for child in created:
        header = registry.header(child)
        events = registry.events(child)
        assert header.parent_session == "src"
        assert len(events) == header.seed_length
        assert events == source_events[: header.seed_length], child
        assert not events or events[-1].type == "turn/end", child
    assert registry.children("src") == sorted(created)


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
    for w in range(APPENDERS):
        status, seqs = results[f"appender-{w}"]
        assert status == "ok", seqs
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
