"""Depth-independent children: a child's record costs the same at any lineage depth, and reading
its log takes at most three round trips (one once its lineage is cached), on a real server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import turn
from redis import Redis
from redis.connection import AbstractConnection

from sessionfork.core import forks, keys
from sessionfork.core.registry import Registry
from sessionfork.core.snapshots import decode_segments

DEPTH = 300


@pytest.fixture
def chain(registry: Registry) -> Iterator[list[str]]:
    """s0 <- s1 <- ... <- s{DEPTH-1}, each with a turn of its own, then its child 'deep'."""
    registry.append(registry.create("s0"), turn(0))
    for d in range(1, DEPTH):
        forks.fork(registry, f"s{d - 1}", f"s{d}")
        registry.append(f"s{d}", turn(d))
    forks.fork(registry, f"s{DEPTH - 1}", "deep")
    forks.fork(registry, "s0", "flat")
    yield [f"s{d}" for d in range(DEPTH)]


def round_trips(run: Callable[[], Any]) -> int:
    sent = {"n": 0}
    original = AbstractConnection.send_packed_command

    def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent["n"] += 1
        original(self, command, check_health)  # type: ignore[no-untyped-call]

    AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        run()
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
    return sent["n"]


def test_a_deep_childs_record_is_as_small_as_a_flat_childs(redis: Redis, chain: list[str]) -> None:
    deep = decode_segments(redis.hget(keys.session("deep"), "seed"))
    # One reference to its parent's seed, one slice of its parent's own log: whatever the depth.
    assert deep == ((chain[-1], -4 * (DEPTH - 1), 0), (chain[-1], 0, 4))
    deep_bytes = int(redis.memory_usage(keys.session("deep"), samples=0))
    flat_bytes = int(redis.memory_usage(keys.session("flat"), samples=0))
    assert deep_bytes <= 2 * flat_bytes, (deep_bytes, flat_bytes)


def test_a_deep_child_reads_its_whole_seed_in_at_most_three_round_trips(redis: Redis, chain: list[str]) -> None:
    expected = [e for d in range(DEPTH) for e in turn(d)]
    fresh = Registry(redis)  # nothing cached
    events: list[Any] = []
    assert round_trips(lambda: events.extend(fresh.events("deep"))) <= 3
    assert [(e.type, e.data) for e in events] == [(e.type, e.data) for e in expected]
    assert [e.seq for e in events] == list(range(4 * DEPTH))
    assert round_trips(lambda: fresh.events("deep")) == 1  # its lineage is cached: it never changes
    assert Registry(redis).events("deep") == Registry(redis).events(chain[-1])


def test_a_child_never_appended_to_stores_neither_seedlen_nor_seedend(registry: Registry, redis: Redis) -> None:
    registry.append(registry.create("p"), [*turn(1), *turn(2)])
    forks.fork(registry, "p", "c")
    assert not {b"seedlen", b"seedend"} & set(redis.hkeys(keys.session("c")))  # both equal len / lastend
    registry.append("c", turn(3))  # the first append writes them before it moves len and lastend
    assert redis.hmget(keys.session("c"), ["seedlen", "seedend", "len", "lastend"]) == [b"8", b"7", b"12", b"11"]
    forks.fork(registry, "c", "g", boundary=3)  # a boundary inside c's seed, checked on p's index
    assert Registry(redis).events("g") == Registry(redis).events("p")[:4]
