"""What a fan-out's child step does per child, counted (issue 26 #12: fan-out got slower).

A fan-out's children share one seed and one source, so what they share is built once: the create
script's call is built once for all of them (its names checked and its shared arguments placed
once), and the script answers ``CREATED`` for a record it made now rather than rebuilding the
header's wire JSON that the caller sent it. Counted, not timed: ``python -m bench.ab COMMIT``
measures the rate against an older commit.
"""

from __future__ import annotations

from typing import Any

import pytest
from fork_helpers import turn
from redis import Redis

from sessionfork.core import forks, lua, wire
from sessionfork.core.registry import CREATED, Registry


def test_a_fan_out_builds_its_childrens_create_calls_as_one(registry: Registry,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    registry.append(registry.create("src", cwd="/w"), turn())
    built: list[str] = []
    build = lua.Spec.build

    def counted(spec: lua.Spec, named: Any) -> Any:
        built.append(spec.name)
        return build(spec, named)

    monkeypatch.setattr(lua.Spec, "build", counted)
    result = forks.fork_many(registry, "src", [f"c{i}" for i in range(64)])
    assert len(result.created) == 64 and not result.failed
    assert built.count("create") == 1, built.count("create")  # one per child before


def test_create_answers_created_for_a_new_child_and_the_header_for_a_replay(
        redis: Redis, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    registry.append(registry.create("src", cwd="/w"), turn())
    replies: list[list[Any]] = []
    eval_many = lua.eval_many

    def recorded(*args: Any, **kwargs: Any) -> list[Any]:
        out = eval_many(*args, **kwargs)
        replies.append(list(out))
        return out

    monkeypatch.setattr(lua, "eval_many", recorded)
    snap = registry.take_snapshot("src")
    first = registry.create_children(snap, ["a", "b"], request_id="r-1")
    again = registry.create_children(snap, ["a", "b"], request_id="r-1")  # a replay: the stored record's
    assert replies[0] == [CREATED, CREATED]
    assert [wire.decode_header(raw) for raw in replies[1]] == first == again
    assert [(h.id, h.cwd, h.parent_session, h.seed_length) for h in first] == [("a", "/w", "src", 4),
                                                                               ("b", "/w", "src", 4)]
    assert [registry.header(c) for c in ("a", "b")] == first
