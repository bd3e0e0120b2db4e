"""``session show``, ``session events`` (inherited seed events marked with the ancestor holding
them, paged reads), ``usage``, and ``outcomes`` with its deprecated name ``events``: on a real
server."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result
from helpers import turn
from redis import Redis

from sessionfork.cli import cli, session_commands
from sessionfork.core import forks, merges, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult, Header, Usage
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.outcomes import Outcomes


def invoke(server: EmbeddedServer, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--redis-url", server.url, *args], obj={}, prog_name="sessionfork")


def _family(registry: Registry) -> None:
    """root (4 events) -> mid (+4) -> leaf (+4), usage on each; root -> gone, merged back."""
    root = registry.create("root", cwd="/w")
    registry.append(root, turn(1), usage=Usage(input_tokens=10, cost_micros=5))
    forks.fork(registry, "root", "mid")
    registry.append("mid", turn(2), usage=Usage(input_tokens=20))
    forks.fork(registry, "mid", "leaf")
    registry.append("leaf", turn(3), usage=Usage(output_tokens=7))
    forks.fork(registry, "root", "gone")
    registry.append("gone", turn(2), usage=Usage(input_tokens=1))
    merges.merge(registry, "root", "gone", mode="events", request_id="m1")


def test_show_json(server: EmbeddedServer, registry: Registry) -> None:
    _family(registry)
    done = invoke(server, "session", "show", "mid", "--json")
    assert done.exit_code == 0, done.output
    shown = json.loads(done.stdout)
    assert shown["header"] == {"version": 0, "id": "mid", "createdAt": shown["header"]["createdAt"], "cwd": "/w",
                               "parentSession": "root", "seedLength": 4}
    assert shown["state"] == {"id": "mid", "state": "live"}
    assert (shown["length"], shown["seedLength"], shown["ownLength"], shown["lastTurnEnd"]) == (8, 4, 4, 7)
    assert shown["children"] == ["leaf"]
    assert shown["usage"]["own"]["inputTokens"] == 20
    assert shown["usage"]["subtree"] == {"inputTokens": 20, "outputTokens": 7, "cacheReadTokens": 0,
                                         "cacheWriteTokens": 0, "costMicros": 0}


def test_show_text_names_the_state_and_usage(server: EmbeddedServer, registry: Registry) -> None:
    _family(registry)
    done = invoke(server, "session", "show", "gone")
    assert done.exit_code == 0, done.output
    assert "state      merged (into root at seq 4)" in done.stdout
    assert "length     8 (4 inherited, 4 own)" in done.stdout
    root = invoke(server, "session", "show", "root").stdout
    assert "subtree: input 31, output 7" in root


def test_show_unknown_session_is_one_line(server: EmbeddedServer, registry: Registry) -> None:
    done = invoke(server, "session", "show", "nobody")
    assert done.exit_code == 1
    assert done.output.strip() == 'error: SESSION_NOT_FOUND: session "nobody" not found'


def test_events_mark_inherited_ones(server: EmbeddedServer, registry: Registry) -> None:
    _family(registry)
    done = invoke(server, "session", "events", "leaf", "--json")
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["event"]["seq"] for line in lines] == list(range(12))
    assert [line["session"] for line in lines] == ["root"] * 4 + ["mid"] * 4 + ["leaf"] * 4
    assert [line["inherited"] for line in lines] == [True] * 8 + [False] * 4
    assert lines[4]["event"]["data"] == {"turn": 2, "trigger": "user"}
    assert [line["event"] for line in lines] == [json.loads(wire.encode_event(e)) for e in registry.events("leaf")]


def test_events_text_and_range(server: EmbeddedServer, registry: Registry) -> None:
    _family(registry)
    done = invoke(server, "session", "events", "leaf", "--from", "3", "--to", "8")
    assert done.exit_code == 0, done.output
    rows = done.stdout.splitlines()
    assert [int(r.split()[0]) for r in rows] == [3, 4, 5, 6, 7, 8]
    assert rows[0].split()[1:3] == ["turn/end", "[root]"]
    assert rows[1].split()[1:3] == ["turn/start", "[mid]"]
    assert "[" not in rows[-1].split()[2]  # seq 8 is leaf's own
    beyond = invoke(server, "session", "events", "leaf", "--from", "50")
    assert (beyond.exit_code, beyond.stdout) == (0, "")


def test_events_read_in_pages(server: EmbeddedServer, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    h = registry.create("long")
    for n in range(10):
        registry.append(h, turn(n))
    reads: list[tuple[int, int | None]] = []
    real = Registry.events

    def counted(self: Registry, sid: str, start: int = 0, stop: int | None = None) -> list[object]:
        reads.append((start, stop))
        return real(self, sid, start, stop)  # type: ignore[return-value]

    monkeypatch.setattr(session_commands, "PAGE", 7)
    monkeypatch.setattr(Registry, "events", counted)
    done = invoke(server, "session", "events", "long", "--json")
    assert done.exit_code == 0, done.output
    assert [json.loads(line)["event"]["seq"] for line in done.stdout.splitlines()] == list(range(40))
    assert reads == [(s, min(s + 7, 40)) for s in range(0, 40, 7)]


def test_usage_command(server: EmbeddedServer, registry: Registry) -> None:
    _family(registry)
    own = invoke(server, "usage", "mid", "--json")
    assert json.loads(own.stdout) == {"id": "mid", "own": {"inputTokens": 20, "outputTokens": 0, "cacheReadTokens": 0,
                                                           "cacheWriteTokens": 0, "costMicros": 0}}
    tree = json.loads(invoke(server, "usage", "root", "--subtree", "--json").stdout)
    assert tree["subtree"]["inputTokens"] == 31 and tree["subtree"]["costMicros"] == 5
    text = invoke(server, "usage", "root", "--subtree").stdout
    assert text.splitlines()[1] == ("root  subtree: input 31, output 7, cache read 0, cache write 0, "
                                    "cost 5 micros")


def test_outcomes_and_the_deprecated_events(server: EmbeddedServer, redis: Redis) -> None:
    reply = ForkResult(request_id="r-1", session=Header(version=0, id="c", created_at=1))
    Outcomes(redis, ttl=60, stream_maxlen=100).record(reply, "sf:replies", duration_us=7, latency_us=9)
    new, old = invoke(server, "outcomes", "--json"), invoke(server, "events", "--json")
    assert (new.exit_code, old.exit_code) == (0, 0)
    assert new.stdout == old.stdout
    assert [json.loads(line)["requestId"] for line in new.stdout.splitlines()] == ["r-1"]
    assert "deprecated" not in new.stderr
    assert old.stderr.startswith("warning: `sessionfork events` is deprecated: use `sessionfork outcomes`")


def test_owners_of_a_summary_child(registry: Registry) -> None:
    from sessionfork.core.wire import Summary

    registry.append(registry.create("src"), [*turn(1), *turn(2)])
    forks.fork(registry, "src", "sum", summary=Summary(keep_from=4, data="turn 1"))
    forks.fork(registry, "sum", "grand")
    assert registry.owners("sum") == [("sum", 0, 1), ("src", 1, 5)]  # its session/summary is its own
    assert registry.owners("grand") == [("sum", 0, 1), ("src", 1, 5)]
    assert registry.owners("src") == []


def test_owners_on_a_cluster(cluster_registry: Registry) -> None:
    _family(cluster_registry)
    assert cluster_registry.owners("leaf") == [("root", 0, 4), ("mid", 4, 8)]
    assert [e.seq for e in cluster_registry.events("leaf", 6, 10)] == [6, 7, 8, 9]
