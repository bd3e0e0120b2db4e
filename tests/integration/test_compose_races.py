"""Guarded forks with edits racing appends to the source, between OS processes on one real server:
every child's seed is exactly the length it guarded on, its edits follow at once, and a guard the
source outgrew is ``PRECONDITION_FAILED`` with nothing created.

The race is made certain and asserted, without any process waiting on one that waits on it: one
"stale" forker announces each length it read (``READ``) and forks only once the source has moved
past it; the appender appends only once that length is announced, then waits until a "fresh"
forker (which never waits) started and finished a fork after the append (``racing.STARTED``/
``DONE``). So every stale fork meets a moved source, and fresh forks succeed at many lengths."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from racing import DONE, OVER, STARTED, ctx_fixture, report, run, spawned_fixture  # noqa: F401  (fixtures)
from redis import Redis

from sessionfork.core import forks, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer, wait_until

TIMEOUT = 60.0
APPENDS = 40
FRESH = 2
READ = "race:stale-read"


def _appender(port: int, source: str, gate: Any, results: Any) -> None:
    def body() -> int:
        client = Redis(port=port)
        try:
            registry = Registry(client)
            gate.wait(TIMEOUT)
            for n in range(APPENDS):  # one whole turn per call: the source is always between turns
                length = registry.length(source)
                wait_until(lambda n=length: client.get(READ) == str(n).encode(), TIMEOUT,
                           "the stale forker to read the length")
                registry.append(source, [NewEvent("turn/start", {"n": n}), NewEvent("assistant/message", {"n": n}),
                                         NewEvent("turn/end", {"n": n})])
                started = int(client.get(STARTED) or 0)
                wait_until(lambda s=started: int(client.get(DONE) or 0) > s, TIMEOUT, "a fresh fork after the append")
            client.set(OVER, 1)
            return APPENDS
        finally:
            client.close()

    report(results, "appender", body)


def _fork(registry: Registry, source: str, child: str, length: int,
          made: list[tuple[str, int]], stale: list[tuple[str, int, str]]) -> None:
    edits = [NewEvent("user/message", {"child": child}), NewEvent("note", {"guard": length})]
    try:
        forks.fork(registry, source, child, if_length=length, edits=edits)
    except ForkError as exc:
        if exc.code is not ErrorCode.PRECONDITION_FAILED:
            raise
        stale.append((child, length, exc.message))
    else:
        made.append((child, length))


def _stale_forker(port: int, source: str, gate: Any, results: Any) -> None:
    def body() -> dict[str, Any]:
        client = Redis(port=port)
        try:
            registry = Registry(client)
            made: list[tuple[str, int]] = []
            stale: list[tuple[str, int, str]] = []
            gate.wait(TIMEOUT)
            i = 0
            while not client.exists(OVER):
                i += 1
                length = registry.length(source)
                client.set(READ, length)
                wait_until(lambda n=length: registry.length(source) > n or bool(client.exists(OVER)), TIMEOUT,
                           "the source to move past the length read")
                _fork(registry, source, f"s-{i}", length, made, stale)
            return {"made": made, "stale": stale}
        finally:
            client.close()

    report(results, "stale", body)


def _fresh_forker(port: int, source: str, worker: int, gate: Any, results: Any) -> None:
    def body() -> dict[str, Any]:
        client = Redis(port=port)
        try:
            registry = Registry(client)
            made: list[tuple[str, int]] = []
            stale: list[tuple[str, int, str]] = []
            gate.wait(TIMEOUT)
            i = 0
            while not client.exists(OVER):
                i += 1
                client.incr(STARTED)
                _fork(registry, source, f"f-{worker}-{i}", registry.length(source), made, stale)
                client.incr(DONE)
            return {"made": made, "stale": stale}
        finally:
            client.close()

    report(results, f"fresh-{worker}", body)


def test_guarded_forks_with_edits_racing_appends_take_exactly_the_guarded_prefix(
    server: EmbeddedServer, registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    registry.create("src")
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(_appender, (server.port, "src")),
                                                               (_stale_forker, (server.port, "src"))]
    jobs += [(_fresh_forker, (server.port, "src", w)) for w in range(FRESH)]
    results = run(ctx, spawned, jobs)

    assert results["appender"] == ("ok", APPENDS)
    made: list[tuple[str, int]] = []
    stale: list[tuple[str, int, str]] = []
    for name in ("stale", *(f"fresh-{w}" for w in range(FRESH))):
        status, value = results[name]
        assert status == "ok", value  # any error but PRECONDITION_FAILED would be reported as such
        made += [tuple(m) for m in value["made"]]  # type: ignore[misc]
        stale += [tuple(s) for s in value["stale"]]  # type: ignore[misc]
    # It raced: every stale fork met a source that moved after its read (one per append), and
    # fresh forks succeeded at many lengths while the appends went on.
    assert len([c for c, _, _ in stale if c.startswith("s-")]) >= APPENDS, stale
    assert len({length for child, length in made if child.startswith("f-")}) >= APPENDS // 2, made
    source = [wire.event_to_builtins(e) for e in registry.events("src")]
    assert len(source) == 3 * APPENDS
    for child, length, message in stale:
        assert not registry.exists(child), child
        assert message.startswith('session "src" has ') and message.endswith(f" events, not {length}")
    for child, length in made:
        header = registry.header(child)
        events = registry.events(child)
        assert (header.parent_session, header.seed_length) == ("src", length), child
        assert [wire.event_to_builtins(e) for e in events[:length]] == source[:length], child
        assert [(e.type, e.seq, e.time, e.data) for e in events[length:]] == [
            ("user/message", length, header.created_at, {"child": child}),
            ("note", length + 1, header.created_at, {"guard": length})], child
