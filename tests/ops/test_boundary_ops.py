"""What operations see of a boundary child: its lineage, its lifecycle event, its persisted file,
and crash repair agreeing with the boundary rule on what an open turn is (real server)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import turn
from redis import Redis
from test_boundary import OPEN, fork_error, inside, make

from sessionfork.core import forks, keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.ops import lineage, repair
from sessionfork.ops.jsonl import path_for
from sessionfork.ops.persist import JsonlBackend


def test_lineage_shows_the_seed_length_of_boundary_children(registry: Registry) -> None:
    make(registry, "a", turn(1), turn(2))
    forks.fork(registry, "a", "c", boundary=3)
    tree = lineage.lineage(registry, "a")
    assert [(n.id, n.seed_length) for n in tree.root.children] == [("c", 4)]
    assert "c  seed=4" in lineage.render_text(tree)


def test_lifecycle_announces_a_boundary_child_with_its_seed_length(registry: Registry, redis: Redis) -> None:
    make(registry, "a", turn(1), turn(2))
    forks.fork(registry, "a", "c", boundary=3)
    created = [{k.decode(): v.decode() for k, v in f.items()} for _, f in redis.xrange(keys.LIFECYCLE_STREAM)]
    assert {"type": "session/created", "id": "c", "len": "4"} in created


def test_persisted_file_of_a_boundary_child_holds_its_seed_then_its_own_events(
        registry: Registry, tmp_path: Path) -> None:
    make(registry, "a", turn(1), turn(2), OPEN)
    forks.fork(registry, "a", "c", boundary=3)
    registry.append("c", turn(5))
    backend = JsonlBackend(registry, tmp_path, consumer="c1", block_ms=10)
    while backend.step():
        pass
    header, *events = [json.loads(line) for line in path_for(tmp_path, registry.header("c")).read_text().splitlines()]
    assert (header["type"], header["parentSession"], header["seedLength"]) == ("session", "a", 4)
    parent = [wire.event_to_builtins(e) for e in registry.events("a")]
    assert events[:4] == parent[:4]
    assert [e["seq"] for e in events] == list(range(8))
    assert [e["type"] for e in events[4:]] == ["turn/start", "user/message", "assistant/message", "turn/end"]


def test_repair_closes_exactly_what_the_boundary_rule_calls_open(registry: Registry) -> None:
    make(registry, "a", turn(1), [NewEvent("todo/write")])
    assert repair.repair(registry, "a") == []  # after a turn/end: between turns, nothing to close
    forks.fork(registry, "a", "x", boundary=4)
    registry.append("a", OPEN)
    with fork_error(*inside("a", 6, 5)):
        forks.fork(registry, "a", "y", boundary=6)
    closed = repair.repair(registry, "a")
    assert [e.type for e in closed] == ["tool/result", "turn/end"]
    forks.fork(registry, "a", "y", boundary=closed[-1].seq)
    assert registry.last_turn_end("a") == closed[-1].seq
