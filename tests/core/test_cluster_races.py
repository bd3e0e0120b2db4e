"""Races between OS processes on a Redis Cluster (3 primaries, 1 replica each), and lineage.

Six processes forking into one child id have exactly one winner; forks racing an appender take
turn-boundary prefixes; the lineage of a fan-out tree lists every descendant and a leaf's ancestors,
and, after four processes forked concurrently under shared parents, each child once under its parent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import pytest
from cluster_fixtures import assert_no_crossslot, completed_source, edges
from helpers import turn
from racing import append_in_lockstep, check_turn_prefix_race, fork_repeatedly, report_on, run

from sessionfork.core import forks
from sessionfork.core.errors import ErrorCode
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedCluster
from sessionfork.ops import lineage

SAME_CHILD_FORKERS = 6
TURNS = 25
FORKERS = 3
FORKS_PER_FORKER = 25
TREE_FORKERS = 4
TREE_ROUNDS = 4


# -- races between OS processes (spawned; each builds its own cluster client) ---------------------


def _same_child_forker(url: str, source: str, child: str, worker: int, gate: Any, results: Any) -> None:
    report_on(url, f"forker-{worker}", gate, results, lambda registry: forks.fork(registry, source, child),
              cluster=True)


def _turn_appender(url: str, source: str, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> int:
        # one event per call, in lockstep with the forkers: the source is often in an open turn
        append_in_lockstep(registry, source, [event for n in range(TURNS) for event in turn(n)])
        return TURNS

    report_on(url, "appender", gate, results, body, cluster=True)


def _repeated_forker(url: str, source: str, worker: int, gate: Any, results: Any) -> None:
    report_on(url, f"forker-{worker}", gate, results,
              lambda registry: fork_repeatedly(registry, source, worker, FORKS_PER_FORKER), cluster=True)


def _tree_forker(url: str, parents: list[str], worker: int, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> list[tuple[str, str]]:
        made: list[tuple[str, str]] = []
        for i in range(TREE_ROUNDS):
            for parent in parents:  # shared parents: every process adds to the same children sets
                child = f"{parent}-w{worker}-{i}"
                forks.fork(registry, parent, child)
                made.append((parent, child))
            grandchild = f"{parents[0]}-w{worker}-{i}-g"  # and a child of the child just made
            forks.fork(registry, f"{parents[0]}-w{worker}-{i}", grandchild)
            made.append((f"{parents[0]}-w{worker}-{i}", grandchild))
        return made

    report_on(url, f"tree-{worker}", gate, results, body, cluster=True)




@pytest.mark.slow
def test_six_processes_forking_into_one_child_id_have_exactly_one_winner(
    cluster: EmbeddedCluster, cluster_registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    completed_source(cluster_registry, "src")
    jobs = [(_same_child_forker, (cluster.url, "src", "child", w)) for w in range(SAME_CHILD_FORKERS)]
    results = run(ctx, spawned, jobs)

    winners = [value for status, value in results.values() if status == "ok"]
    losers = [value for status, value in results.values() if status == "fork-error"]
    assert len(winners) == 1
    assert [(e.code, e.message) for e in losers] == [
        (ErrorCode.SESSION_ALREADY_EXISTS, 'session "child" already exists')] * (SAME_CHILD_FORKERS - 1)
    assert cluster_registry.header("child") == winners[0]
    assert cluster_registry.events("child") == cluster_registry.events("src")
    assert cluster_registry.children("src") == ["child"]


@pytest.mark.slow
def test_forks_while_another_process_appends_whole_turns_take_turn_boundary_prefixes(
    cluster: EmbeddedCluster, cluster_registry: Registry, ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    cluster_registry.create("src")
    jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(_turn_appender, (cluster.url, "src"))]
    jobs += [(_repeated_forker, (cluster.url, "src", w)) for w in range(FORKERS)]
    results = run(ctx, spawned, jobs)

    check_turn_prefix_race(cluster_registry, results, TURNS, FORKERS, FORKS_PER_FORKER)


# -- lineage ---------------------------------------------------------------------------------------


@pytest.fixture
def tree(cluster_registry: Registry) -> dict[str, list[str]]:
    """root -> r0 r1 r2 -> r0.0 r0.1 / r2.0 -> r0.0.0 r0.0.1, fan-outs each after a turn of the parent.

    Seeds: 8 under root, 12 under r0 and r2, 16 under r0.0. Returns parent -> children.
    """
    completed_source(cluster_registry, "root")
    layout = {"root": ["r0", "r1", "r2"], "r0": ["r0.0", "r0.1"], "r2": ["r2.0"], "r0.0": ["r0.0.0", "r0.0.1"]}
    for parent, children in layout.items():
        cluster_registry.append(parent, turn(9))
        result = forks.fork_many(cluster_registry, parent, children)
        assert not result.failed
    return layout


def test_lineage_lists_every_descendant_of_a_three_level_tree_with_fan_out(
    cluster_registry: Registry, tree: dict[str, list[str]]
) -> None:
    found = lineage.lineage(cluster_registry, "root")
    assert found.ancestors == []
    assert edges(found) == [("root", "r0"), ("r0", "r0.0"), ("r0.0", "r0.0.0"), ("r0.0", "r0.0.1"),
                            ("r0", "r0.1"), ("root", "r1"), ("root", "r2"), ("r2", "r2.0")]
    assert {n.id: n.seed_length for n in found.root.children} == {"r0": 8, "r1": 8, "r2": 8}
    assert [n.seed_length for n in found.root.children[0].children] == [12, 12]
    assert [n.seed_length for n in found.root.children[0].children[0].children] == [16, 16]


def test_lineage_lists_the_ancestors_of_a_leaf_oldest_first(
    cluster_registry: Registry, tree: dict[str, list[str]]
) -> None:
    found = lineage.lineage(cluster_registry, "r0.0.1")
    assert [n.id for n in found.ancestors] == ["root", "r0", "r0.0"]
    assert [n.seed_length for n in found.ancestors] == [0, 8, 12]
    assert (found.root.id, found.root.seed_length, found.root.children) == ("r0.0.1", 16, [])


@pytest.mark.slow
def test_lineage_lists_each_child_of_concurrent_forks_from_four_processes_once_under_its_parent(
    cluster: EmbeddedCluster, cluster_registry: Registry, tree: dict[str, list[str]],
    ctx: SpawnContext, spawned: list[SpawnProcess]
) -> None:
    parents = ["root", "r0", "r0.0.1"]
    jobs = [(_tree_forker, (cluster.url, parents, w)) for w in range(TREE_FORKERS)]
    results = run(ctx, spawned, jobs)

    made: list[tuple[str, str]] = []
    for status, value in results.values():
        assert status == "ok", value
        made += value
    assert len(made) == TREE_FORKERS * TREE_ROUNDS * (len(parents) + 1)
    before = [(p, c) for p, children in tree.items() for c in children]
    found = edges(lineage.lineage(cluster_registry, "root"))
    assert sorted(found) == sorted(before + made)
    counts = Counter(child for _, child in found)
    assert max(counts.values()) == 1


def test_no_node_answered_crossslot_to_any_operation_of_the_module(cluster: EmbeddedCluster) -> None:
    """Last: every test of this module ran on this cluster (one per module); no node answered
    CROSSSLOT, failed a script but for NOSCRIPT, or rejected a command."""
    assert_no_crossslot(cluster)
