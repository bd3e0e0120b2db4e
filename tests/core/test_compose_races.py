"""Guarded forks with edits racing appends to the source, between OS processes on one real server:
every child's seed is exactly the length it guarded on, its edits follow at once, and a guard the
source outgrew is ``PRECONDITION_FAILED`` with nothing created.

The race is made certain and asserted, without any process waiting on one that waits on it: one
"stale" forker announces each length it read (``READ``) and forks only once the source has moved
past it; the appender appends only once that length is announced, then waits until a "fresh"
forker (which never waits) started and finished a fork after the append (``racing.a_later_fork``).
So every stale fork meets a moved source, and fresh forks succeed at many lengths."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from racing import OVER, a_later_fork, counted, report_on, run, succeeded
from waits import wait_until

from sessionfork.core import forks, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer

TIMEOUT = 60.0
APPENDS = 40
FRESH = 2
READ = "race:stale-read"


def _appender(port: int, source: str, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> int:
        client = registry.redis
        for n in range(APPENDS):  # one whole turn per call: the source is always between turns
            length = registry.length(source)
            wait_until(lambda n=length: client.get(READ) == str(n).encode(), TIMEOUT,
                       "the stale forker to read the length")
            registry.append(source, [NewEvent("turn/start", {"n": n}), NewEvent("assistant/message", {"n": n}),
                                     NewEvent("turn/end", {"n": n})])
            a_later_fork(client, "a fresh fork after the append")
        client.set(OVER, 1)
        return APPENDS

    report_on(port, "appender", gate, results, body)


class _Forks:
    """The guarded forks one process made and those refused ``PRECONDITION_FAILED``."""

    def __init__(self, registry: Registry, source: str) -> None:
        self.registry, self.source = registry, source
        self.made: list[tuple[str, int]] = []
        self.stale: list[tuple[str, int, str]] = []

    def fork(self, child: str, length: int) -> None:
        edits = [NewEvent("user/message", {"child": child}), NewEvent("note", {"guard": length})]
        try:
            forks.fork(self.registry, self.source, child, if_length=length, edits=edits)
        except ForkError as exc:
            if exc.code is not ErrorCode.PRECONDITION_FAILED:
                raise
            self.stale.append((child, length, exc.message))
        else:
            self.made.append((child, length))

    def report(self) -> dict[str, Any]:
        return {"made": self.made, "stale": self.stale}


def _stale_forker(port: int, source: str, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> dict[str, Any]:
        client, done = registry.redis, _Forks(registry, source)
        i = 0
        while not client.exists(OVER):
            i += 1
            length = registry.length(source)
            client.set(READ, length)
            wait_until(lambda n=length: registry.length(source) > n or bool(client.exists(OVER)), TIMEOUT,
                       "the source to move past the length read")
            done.fork(f"s-{i}", length)
        return done.report()

    report_on(port, "stale", gate, results, body)


def _fresh_forker(port: int, source: str, worker: int, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> dict[str, Any]:
        client, done = registry.redis, _Forks(registry, source)
        i = 0
        while not client.exists(OVER):
            i += 1
            with counted(client):
                done.fork(f"f-{worker}-{i}", registry.length(source))
        return done.report()

    report_on(port, f"fresh-{worker}", gate, results, body)


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
    # any error but PRECONDITION_FAILED would be reported as such
    for value in succeeded(results, "stale", *(f"fresh-{w}" for w in range(FRESH))):
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
