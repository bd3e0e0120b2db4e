"""Usage on append: a session's own counters (its seed's not counted again), its subtree's total
(every descendant: merged, abandoned, disposed and deleted ones included), retries never counted
twice, bad usage refused before anything is written. On one real server and a real cluster."""

from __future__ import annotations

import pytest
from fork_helpers import state
from helpers import turn
from redis import Redis

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent, Usage


def _tree(registry: Registry) -> None:
    """root (1 in, 10 cost) -> a (2 in) -> a1 (4 in); root -> b (8 in, 3 out, 5 cr, 6 cw, 100 cost)."""
    root = registry.create("root")
    registry.append(root, turn(1), usage=Usage(input_tokens=1, cost_micros=10))
    forks.fork(registry, "root", "a")
    registry.append("a", turn(2), usage=Usage(input_tokens=2))
    forks.fork(registry, "a", "a1")
    registry.append("a1", turn(3), usage=Usage(input_tokens=4))
    forks.fork(registry, "root", "b")
    registry.append("b", turn(2), usage=Usage(input_tokens=8, output_tokens=3, cache_read_tokens=5,
                                              cache_write_tokens=6, cost_micros=100))


def test_own_usage_and_subtree_total(registry: Registry) -> None:
    _tree(registry)
    root = registry.usage("root")
    assert root.own == Usage(input_tokens=1, cost_micros=10)
    assert root.subtree == Usage(input_tokens=15, output_tokens=3, cache_read_tokens=5, cache_write_tokens=6,
                                 cost_micros=110)
    a = registry.usage("a")
    assert a.own == Usage(input_tokens=2)  # the seed's usage (root's) is not counted again
    assert a.subtree == Usage(input_tokens=6)
    assert registry.usage("a1").subtree == Usage(input_tokens=4)


def test_appends_add_up(registry: Registry) -> None:
    h = registry.create("s")
    registry.append(h, turn(1), usage=Usage(output_tokens=5))
    registry.append(h, turn(2))
    registry.append(h, turn(3), usage=Usage(output_tokens=7, cost_micros=1))
    assert registry.usage("s").own == Usage(output_tokens=12, cost_micros=1)


def test_retried_append_counts_once(redis: Redis) -> None:
    registry = Registry(redis, new_call_id=lambda: "call-1")  # the retry of one call: the same call id
    h = registry.create("s")
    registry.append(h, turn(1), usage=Usage(input_tokens=3))
    registry.append(h, turn(1), usage=Usage(input_tokens=3))
    assert registry.length("s") == 4  # one turn: appended once
    assert registry.usage("s").own == Usage(input_tokens=3)


def test_deleted_descendants_stay_in_the_total(registry: Registry) -> None:
    _tree(registry)
    registry.delete("a1")  # a leaf: gone for good
    registry.delete("a")   # then its parent
    root = registry.usage("root")
    assert root.subtree.input_tokens == 15
    registry.delete("b")
    assert registry.usage("root").subtree.cost_micros == 110
    assert registry.usage("a").own == Usage(input_tokens=2)  # a tombstone answers its own


def test_deleted_middle_with_a_live_child_stays_in_the_total(registry: Registry) -> None:
    _tree(registry)
    registry.delete("a")  # pinned by a1
    assert registry.usage("root").subtree.input_tokens == 15
    registry.delete("a1")
    assert registry.usage("root").subtree.input_tokens == 15


@pytest.mark.parametrize("bad", [
    {"input_tokens": -1}, {"output_tokens": 1.5}, {"cost_micros": True}, {"cache_read_tokens": "3"},
    {"cache_write_tokens": 2**53},
])
def test_bad_usage_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ForkError) as info:
        Usage(**bad)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert next(iter(bad)).split("_")[0] in info.value.message.lower()


def test_bad_usage_writes_nothing(registry: Registry, redis: Redis) -> None:
    h = registry.create("s")
    before = state(redis)
    for usage in ({"inputTokens": 3}, Usage(input_tokens=1)):
        events = [] if isinstance(usage, Usage) else turn(1)
        with pytest.raises(ForkError) as info:
            registry.append(h, events, usage=usage)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.INVALID_REQUEST
    assert state(redis) == before


def test_unknown_session(registry: Registry) -> None:
    with pytest.raises(ForkError) as info:
        registry.usage("nope")
    assert info.value.code is ErrorCode.SESSION_NOT_FOUND


def test_usage_on_a_cluster(cluster_registry: Registry) -> None:
    """On a cluster every total is the walk: the root's too (its record is in another slot)."""
    _tree(cluster_registry)
    assert cluster_registry.usage("root").subtree == Usage(input_tokens=15, output_tokens=3, cache_read_tokens=5,
                                                           cache_write_tokens=6, cost_micros=110)
    cluster_registry.delete("a")  # pinned by a1: still walked
    assert cluster_registry.usage("root").subtree.input_tokens == 15
    assert cluster_registry.usage("a").own == Usage(input_tokens=2)
    assert cluster_registry.usage("a").subtree == Usage(input_tokens=6)


def test_the_wire_names(registry: Registry) -> None:
    from sessionfork.core import wire

    h = registry.create("s")
    registry.append(h, [NewEvent("turn/start"), NewEvent("turn/end")], usage=Usage(cache_read_tokens=2))
    assert wire.encode(registry.usage("s").own) == (b'{"inputTokens":0,"outputTokens":0,"cacheReadTokens":2,'
                                                    b'"cacheWriteTokens":0,"costMicros":0}')


def test_a_root_total_equals_the_sum_of_every_own_usage(registry: Registry) -> None:
    """The root's totals (summed by each append) and the walk (summed at read) agree, at depth."""
    root = registry.create("r")
    registry.append(root, turn(0), usage=Usage(cost_micros=1))
    parent = "r"
    for depth in range(1, 30):
        forks.fork(registry, parent, f"r{depth}")
        forks.fork(registry, parent, f"r{depth}x")
        registry.append(f"r{depth}", turn(depth), usage=Usage(cost_micros=depth, input_tokens=2))
        registry.append(f"r{depth}x", turn(depth), usage=Usage(output_tokens=depth))
        parent = f"r{depth}"
    owns = [registry.usage(s).own for s in ["r", *(f"r{d}" for d in range(1, 30)), *(f"r{d}x" for d in range(1, 30))]]
    total = sum(owns, Usage())
    assert registry.usage("r").subtree == total == Usage(input_tokens=58, output_tokens=435, cost_micros=436)
    # r1's subtree: all but r's own and r1x's (walked, not a root)
    assert registry.usage("r1").subtree == Usage(input_tokens=58, output_tokens=434, cost_micros=435)


def test_a_retry_from_another_process_counts_once_in_the_root_total(redis: Redis) -> None:
    first = Registry(redis)
    first.create("r")
    forks.fork(first, "r", "c")
    again = Registry(redis, new_call_id=lambda: "call-7")  # a fresh process: no root known yet
    again.append("c", turn(1), usage=Usage(input_tokens=5))
    Registry(redis, new_call_id=lambda: "call-7").append("c", turn(1), usage=Usage(input_tokens=5))
    assert first.length("c") == 4
    assert first.usage("r").subtree == Usage(input_tokens=5)
    assert first.usage("c").own == Usage(input_tokens=5)


def test_a_deleted_root_goes_on_summing(registry: Registry) -> None:
    _tree(registry)
    registry.delete("root")
    registry.append("b", turn(3), usage=Usage(input_tokens=100))
    assert registry.usage("root").subtree.input_tokens == 115
    assert registry.usage("root").own == Usage(input_tokens=1, cost_micros=10)


def test_a_branch_walk_counts_its_pinned_deleted_descendants(registry: Registry) -> None:
    _tree(registry)
    forks.fork(registry, "a1", "a2")
    registry.append("a2", turn(4), usage=Usage(input_tokens=32))
    registry.delete("a1")  # pinned by a2: kept in a's children
    assert registry.usage("a").subtree == Usage(input_tokens=38)
    registry.delete("a2")  # gone for good, and a1 with it: the root's total keeps them
    assert registry.usage("root").subtree.input_tokens == 47


def test_a_root_deleted_before_any_usage_sums_what_comes_after(registry: Registry) -> None:
    registry.create("r")
    forks.fork(registry, "r", "c")
    forks.fork(registry, "c", "g")
    registry.delete("r")  # a tombstone without usage: no counters kept
    registry.append("g", turn(1), usage=Usage(input_tokens=9))
    registry.delete("g")  # gone for good: out of every walk
    assert registry.usage("r").subtree == Usage(input_tokens=9)
