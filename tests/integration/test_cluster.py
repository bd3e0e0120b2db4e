"""sessionfork on a Redis Cluster (3 primaries, 1 replica each).

Fork semantics and idempotency, the worker path with a cluster registry, races between OS
processes, lineage, the spread of sessions over the primaries, failover while forks run, and, last,
that no node ever answered CROSSSLOT.
"""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import pytest
from cluster_fixtures import (  # noqa: F401  (fixtures: registered under their ``name=``)
    cluster_client_fixture,
    cluster_fixture,
    cluster_registry_fixture,
    running_cluster,
)
from helpers import clean_environ, cli_args, make_client, stop, turn, wait_registered, worker_name
from msgspec import UNSET
from racing import (  # noqa: F401  (fixtures: ctx, spawned)
    append_in_lockstep,
    check_turn_prefix_race,
    ctx_fixture,
    fork_repeatedly,
    report_on,
    run,
    spawned_fixture,
)
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, ClusterError, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sessionfork.core import forks, keys
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.lua import NotReplicated
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Event, ForkFailure, ForkResult, Header, LiveHandle, NewEvent
from sessionfork.embedded import EmbeddedCluster, EmbeddedServer, wait_until
from sessionfork.ops import lineage
from sessionfork.queue.client import Client

TIMEOUT = 60.0
SAME_CHILD_FORKERS = 6
TURNS = 25
FORKERS = 3
FORKS_PER_FORKER = 25
TREE_FORKERS = 4
TREE_ROUNDS = 4
SPREAD_SESSIONS = 60
FAILOVER_FORKS_BEFORE = 30
FAILOVER_FORKS_AFTER = 30
FAILOVER_MAX_FORKS = 5_000
FAILOVER_MAX_ATTEMPTS = 5_000
MAX_LOST_WITHOUT_WAIT = 5
RETRYABLE = (RedisConnectionError, RedisTimeoutError, ClusterDownError, ClusterError, SlotNotCoveredError,
             NotReplicated)


# -- helpers ---------------------------------------------------------------------------------------


def completed_source(registry: Registry, sid: str = "src", cwd: str | None = None) -> LiveHandle:
    """A live session with one finished turn (4 events)."""
    handle = registry.create(sid, cwd=cwd)
    registry.append(handle, turn(1))
    return handle


@contextmanager
def fork_error(code: ErrorCode, message: str) -> Iterator[None]:
    with pytest.raises(ForkError) as info:
        yield
    assert (info.value.code, info.value.message) == (code, message)


def shape(events: Sequence[Event]) -> list[tuple[int, str, Any]]:
    return [(e.seq, e.type, e.data) for e in events]


def session_ids(cluster: EmbeddedCluster) -> set[str]:
    """Ids of every session record on the cluster's primaries (logs and children sets excluded)."""
    found: set[str] = set()
    for node in cluster.masters:
        with node.client() as c:
            for key in c.scan_iter(match="sf:s:*", count=1000):
                text = key.decode()
                if text.endswith("}"):
                    found.add(text[len("sf:s:{"):-1])
    return found


def edges(tree: lineage.Lineage) -> list[tuple[str, str]]:
    """Every (parent, child) pair under the lineage's root, depth first."""
    out: list[tuple[str, str]] = []

    def walk(node: lineage.Node) -> None:
        for child in node.children:
            out.append((node.id, child.id))
            walk(child)

    walk(tree.root)
    return out


# -- fork semantics --------------------------------------------------------------------------------


def test_fork_of_a_never_created_session_is_session_not_found(cluster_registry: Registry) -> None:
    with fork_error(ErrorCode.SESSION_NOT_FOUND, 'session "ghost" not found'):
        forks.fork(cluster_registry, "ghost", "child")
    assert not cluster_registry.exists("child")


def test_fork_of_a_disposed_session_is_session_not_found(cluster_registry: Registry) -> None:
    cluster_registry.dispose(completed_source(cluster_registry, "gone"))
    with fork_error(ErrorCode.SESSION_NOT_FOUND, 'session "gone" not found'):
        forks.fork(cluster_registry, "gone", "child")
    assert not cluster_registry.exists("child")


def test_fork_by_a_stale_handle_is_session_not_live(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    with fork_error(ErrorCode.SESSION_NOT_LIVE, 'session "src" is not the live store instance'):
        forks.fork(cluster_registry, LiveHandle("src", "stale-token"), "child")
    assert not cluster_registry.exists("child")


def test_fork_into_an_existing_session_is_session_already_exists(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    cluster_registry.create("taken")
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "taken" already exists'):
        forks.fork(cluster_registry, "src", "taken")
    assert cluster_registry.header("taken").parent_session is UNSET


def test_fork_into_a_disposed_id_is_session_already_exists(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    cluster_registry.dispose(cluster_registry.create("gone"))
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "gone" already exists'):
        forks.fork(cluster_registry, "src", "gone")


def test_duplicate_child_id_is_reported_before_open_turn_of_the_source(cluster_registry: Registry) -> None:
    handle = completed_source(cluster_registry, "src")
    cluster_registry.create("taken")
    cluster_registry.append(handle, [NewEvent("turn/start")])
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "taken" already exists'):
        forks.fork(cluster_registry, handle, "taken")


@pytest.mark.parametrize("tail", [["turn/start"], ["turn/start", "user/message"],
                                  ["turn/start", "assistant/message", "tool/call"]],
                         ids=["turn-start", "user-message", "tool-call"])
def test_fork_inside_an_open_turn_is_open_turn_naming_the_last_event(
    cluster_registry: Registry, tail: list[str]
) -> None:
    handle = completed_source(cluster_registry, "src")
    cluster_registry.append(handle, [NewEvent(t) for t in tail])
    message = f'cannot fork session "src" inside an open turn (last event: {tail[-1]})'
    with fork_error(ErrorCode.OPEN_TURN, message):
        forks.fork(cluster_registry, "src", "child")
    assert not cluster_registry.exists("child")


def test_fork_of_a_fork_of_a_fork_reads_the_right_events_at_every_level(cluster_registry: Registry) -> None:
    expected: dict[str, list[tuple[int, str, Any]]] = {"A": []}

    def add(sid: str, n: int) -> None:
        events = turn(n)
        cluster_registry.append(sid, events)
        log = expected[sid]
        base = len(log)
        log.extend((base + i, e.type, e.data) for i, e in enumerate(events))

    def fork(parent: str, child: str) -> None:
        forks.fork(cluster_registry, parent, child)
        expected[child] = list(expected[parent])

    cluster_registry.create("A")
    add("A", 0)
    fork("A", "B")
    add("A", 1)  # after the fork: not in B
    add("B", 2)
    fork("B", "C")
    add("B", 3)
    add("C", 4)
    add("C", 5)
    fork("C", "D")
    add("C", 6)
    fork("D", "E")  # E has no own events: its seed is D's whole log
    add("D", 7)

    for sid, log in expected.items():
        assert shape(cluster_registry.events(sid)) == log, sid
        for start in range(0, len(log) + 1, 3):
            assert shape(cluster_registry.events(sid, start, start + 5)) == log[start:start + 5], (sid, start)
    assert [len(expected[s]) for s in "ABCDE"] == [8, 12, 20, 20, 16]
    assert [cluster_registry.header(s).seed_length for s in "BCDE"] == [4, 8, 16, 16]
    assert [cluster_registry.header(s).parent_session for s in "BCDE"] == ["A", "B", "C", "D"]


def test_append_to_the_source_after_a_fork_does_not_change_the_child(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    forks.fork(cluster_registry, "src", "child")
    before = cluster_registry.events("child")
    cluster_registry.append("src", turn(2))
    assert cluster_registry.events("child") == before
    assert cluster_registry.length("child") == 4
    assert cluster_registry.events("src")[:4] == before


def test_append_to_the_child_does_not_change_the_source(cluster_registry: Registry) -> None:
    completed_source(cluster_registry, "src")
    forks.fork(cluster_registry, "src", "child")
    source = cluster_registry.events("src")
    added = cluster_registry.append("child", turn(2))
    assert [e.seq for e in added] == [4, 5, 6, 7]
    assert cluster_registry.events("src") == source
    assert cluster_registry.events("child") == source + added


# -- idempotency -----------------------------------------------------------------------------------


def test_fork_retried_with_its_request_id_returns_the_same_child_after_the_source_opened_a_turn(
    cluster: EmbeddedCluster, cluster_registry: Registry
) -> None:
    handle = completed_source(cluster_registry, "src")
    first = forks.fork(cluster_registry, "src", "c", request_id="r")
    cluster_registry.append(handle, [NewEvent("turn/start")])
    again = forks.fork(cluster_registry, "src", "c", request_id="r")
    assert again == first
    assert cluster_registry.children("src") == ["c"]
    assert session_ids(cluster) == {"src", "c"}


def test_fan_out_with_one_existing_id_reports_it_failed_and_creates_the_rest(
    cluster: EmbeddedCluster, cluster_registry: Registry
) -> None:
    completed_source(cluster_registry, "src")
    cluster_registry.create("k2")
    ids = [f"k{i}" for i in range(6)]
    result = forks.fork_many(cluster_registry, "src", ids, request_id="fan")
    assert [h.id for h in result.created] == ["k0", "k1", "k3", "k4", "k5"]
    assert [(cid, e.code, e.message) for cid, e in result.failed] == [
        ("k2", ErrorCode.SESSION_ALREADY_EXISTS, 'session "k2" already exists')]
    assert cluster_registry.children("src") == ["k0", "k1", "k3", "k4", "k5"]
    assert {h.seed_length for h in result.created} == {4}
    assert cluster_registry.header("k2").parent_session is UNSET
    assert session_ids(cluster) == {"src", *ids}


# -- the worker path with a cluster registry -------------------------------------------------------


@pytest.fixture(scope="module")
def queue_server() -> Iterator[EmbeddedServer]:
    """The queue's own single server (RQ, outcomes, replies); never flushed, ids are unique."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture(scope="module")
def cluster_worker(cluster: EmbeddedCluster, queue_server: EmbeddedServer) -> Iterator[subprocess.Popen[bytes]]:
    name = worker_name("cluster")
    proc = subprocess.Popen(
        cli_args(cluster.url, "--queue-url", queue_server.url, "--cluster", "worker", "--name", name,
                 "--log-level", "WARNING"),
        env=clean_environ(), stdin=subprocess.DEVNULL)
    try:
        with queue_server.client() as probe:
            wait_registered(probe, name, TIMEOUT)
        yield proc
    finally:
        assert stop(proc) == 0


@pytest.fixture
def queue_client(queue_server: EmbeddedServer, cluster_worker: subprocess.Popen[bytes]) -> Iterator[Client]:
    assert cluster_worker.poll() is None, f"the cluster worker exited with {cluster_worker.returncode}"
    redis = queue_server.client()
    yield make_client(redis)
    redis.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_worker_with_a_cluster_registry_forks_a_request(cluster_registry: Registry, queue_client: Client) -> None:
    completed_source(cluster_registry, "src", cwd="/w")
    reply = queue_client.fork("src", session_id="child", request_id=unique("req"), timeout=TIMEOUT)
    assert isinstance(reply, ForkResult) and isinstance(reply.session, Header), reply
    assert (reply.session.id, reply.session.parent_session, reply.session.seed_length, reply.session.cwd) == (
        "child", "src", 4, "/w")
    assert cluster_registry.events("child") == cluster_registry.events("src")
    assert cluster_registry.children("src") == ["child"]


def test_worker_with_a_cluster_registry_answers_open_turn(cluster_registry: Registry, queue_client: Client) -> None:
    handle = completed_source(cluster_registry, "src")
    cluster_registry.append(handle, [NewEvent("turn/start")])
    request_id = unique("req")
    reply = queue_client.fork("src", session_id="child", request_id=request_id, timeout=TIMEOUT)
    assert reply == ForkFailure(request_id=request_id, code="OPEN_TURN",
                                message='cannot fork session "src" inside an open turn (last event: turn/start)')
    assert not cluster_registry.exists("child")


def test_worker_with_a_cluster_registry_answers_a_retried_request_with_its_first_outcome(
    cluster: EmbeddedCluster, cluster_registry: Registry, queue_client: Client
) -> None:
    handle = completed_source(cluster_registry, "src")
    request_id = unique("req")
    first = queue_client.fork("src", session_id="child", request_id=request_id, timeout=TIMEOUT)
    assert first.ok, first
    cluster_registry.append(handle, [NewEvent("turn/start")])
    again = queue_client.fork("src", session_id="child", request_id=request_id, timeout=TIMEOUT)
    assert again == first
    assert cluster_registry.children("src") == ["child"]
    assert session_ids(cluster) == {"src", "child"}


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


# -- key spread ------------------------------------------------------------------------------------


def test_sixty_sessions_spread_over_every_master(cluster: EmbeddedCluster, cluster_registry: Registry) -> None:
    for i in range(SPREAD_SESSIONS):
        cluster_registry.create(f"s-{i}")
    per_master = []
    for node in cluster.masters:
        with node.client() as c:
            assert c.dbsize() > 0, node.port
            per_master.append(sum(1 for _ in c.scan_iter(match="sf:s:*", count=1000)))
    assert all(n > 0 for n in per_master), per_master
    assert sum(per_master) == SPREAD_SESSIONS


# -- WAIT and the replay path ----------------------------------------------------------------------


def test_a_fork_retried_after_not_replicated_waits_for_the_replicas_again(
    cluster_client: RedisCluster, cluster_registry: Registry
) -> None:
    completed_source(cluster_registry, "src")
    strict = Registry(cluster_client, wait_replicas=2, wait_timeout_ms=50)  # each primary has 1 replica
    with pytest.raises(NotReplicated):
        forks.fork(strict, "src", "child", request_id="r")
    with pytest.raises(NotReplicated):
        forks.fork(strict, "src", "child", request_id="r")


def test_a_child_replayed_after_an_interrupted_fork_is_indexed_under_its_parent(
    cluster_client: RedisCluster, cluster_registry: Registry
) -> None:
    completed_source(cluster_registry, "src")
    strict = Registry(cluster_client, wait_replicas=2, wait_timeout_ms=50)
    with pytest.raises(NotReplicated):
        forks.fork(strict, "src", "child", request_id="r")
    forks.fork(cluster_registry, "src", "child", request_id="r")
    assert cluster_registry.children("src") == ["child"]
    assert edges(lineage.lineage(cluster_registry, "src")) == [("src", "child")]


# -- failover while forks run ----------------------------------------------------------------------


class Forker(threading.Thread):
    """Forks ``source`` into fo-0, fo-1, ... (request ids req-0, ...), each retried until it succeeds."""

    def __init__(self, registry: Registry, source: str) -> None:
        super().__init__(daemon=True)
        self.registry = registry
        self.source = source
        self.acked: list[Header] = []
        self.retries: Counter[str] = Counter()
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            for i in range(FAILOVER_MAX_FORKS):
                if self.halt.is_set():
                    return
                self.acked.append(self._fork(f"fo-{i}", f"req-{i}"))
        except BaseException as exc:
            self.error = exc

    def _fork(self, child: str, request_id: str) -> Header:
        deadline = time.monotonic() + TIMEOUT
        for _ in range(FAILOVER_MAX_ATTEMPTS):
            try:
                return forks.fork(self.registry, self.source, child, request_id=request_id)
            except RETRYABLE as exc:
                self.retries[type(exc).__name__] += 1
                if time.monotonic() > deadline:
                    raise
        raise AssertionError(f"{request_id}: no success in {FAILOVER_MAX_ATTEMPTS} attempts")

    def successes(self) -> int:
        if self.error is not None:
            raise AssertionError(f"forker failed: {self.error!r}") from self.error
        return len(self.acked)


def role(node: EmbeddedServer) -> str:
    with node.client() as c:
        return str(c.info("replication")["role"])


def link_up(node: EmbeddedServer) -> bool:
    with node.client() as c:
        info = c.info("replication")
    return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")


def caught_up(master: EmbeddedServer) -> bool:
    """The primary's replicas have acknowledged everything it has written."""
    with master.client() as c:
        info = c.info("replication")
    offsets = [v["offset"] for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return bool(offsets) and min(offsets) >= info["master_repl_offset"]


@dataclass(frozen=True)
class Failover:
    """What a failover run saw: acknowledged children, those missing afterwards, those missing
    from the source's children index, and retries per error type."""

    acked: int
    missing: list[str]
    unindexed: int
    retries: dict[str, int]

    def __str__(self) -> str:
        return (f"{self.acked} acknowledged forks, {len(self.missing)} lost {self.missing}, {self.unindexed} not "
                f"in the children index, retries {self.retries}")


def failover_while_forking(wait_replicas: int) -> Failover:
    """Fork continuously, SIGKILL the source's primary, wait for its replica's promotion, fork on.

    With ``wait_replicas``, the killed node is restarted once the replica took over, so that the new
    primary has a replica to acknowledge the forks.
    """
    with running_cluster() as cluster:
        client = RedisCluster.from_url(cluster.url)
        forker: Forker | None = None
        try:
            registry = Registry(client, wait_replicas=wait_replicas, wait_timeout_ms=500)
            completed_source(registry, "src")
            owner = client.get_node_from_key(keys.session("src"))  # type: ignore[no-untyped-call]
            victim = next(i for i, m in enumerate(cluster.masters) if m.port == owner.port)
            wait_until(lambda: caught_up(cluster.masters[victim]), TIMEOUT, "the source to reach its replica")
            forker = Forker(registry, "src")
            forker.start()
            wait_until(lambda: forker.successes() >= FAILOVER_FORKS_BEFORE, TIMEOUT, "forks before the kill")
            cluster.masters[victim].kill()
            promoted = cluster.replicas[victim]
            wait_until(lambda: role(promoted) == "master" and cluster.is_ok(), TIMEOUT, "the replica's promotion")
            if wait_replicas:
                cluster.masters[victim].start()
                wait_until(lambda: link_up(cluster.masters[victim]), TIMEOUT, "the old primary to rejoin as replica")
            after = forker.successes()
            wait_until(lambda: forker.successes() >= after + FAILOVER_FORKS_AFTER, TIMEOUT, "forks after failover")
            forker.halt.set()
            forker.join(TIMEOUT)
            assert not forker.is_alive()
            assert forker.error is None, repr(forker.error)
            reader = Registry(client)
            source = reader.events("src")
            missing = []
            for header in forker.acked:
                if not reader.exists(header.id):
                    missing.append(header.id)
                    continue
                assert isinstance(header.seed_length, int), header
                assert reader.events(header.id) == source[: header.seed_length], header.id
            indexed = set(reader.children("src"))
            return Failover(acked=len(forker.acked), missing=missing, retries=dict(forker.retries),
                            unindexed=sum(1 for h in forker.acked if h.id not in indexed))
        finally:
            if forker is not None:
                forker.halt.set()
                forker.join(TIMEOUT)
            client.close()


@pytest.mark.slow
def test_forks_go_on_after_the_sources_primary_is_killed_and_few_acknowledged_children_are_lost() -> None:
    seen = failover_while_forking(wait_replicas=0)
    print(f"\nfailover without WAIT: {seen}")
    assert seen.acked >= FAILOVER_FORKS_BEFORE + FAILOVER_FORKS_AFTER
    assert len(seen.missing) <= MAX_LOST_WITHOUT_WAIT, seen
    assert seen.unindexed <= MAX_LOST_WITHOUT_WAIT, seen  # an index entry is an acknowledged write too


@pytest.mark.slow
def test_with_wait_replicas_no_acknowledged_child_is_lost_across_a_failover() -> None:
    seen = failover_while_forking(wait_replicas=1)
    print(f"\nfailover with WAIT 1: {seen}")
    assert seen.acked >= FAILOVER_FORKS_BEFORE + FAILOVER_FORKS_AFTER
    assert seen.missing == [], seen
    assert seen.unindexed == 0, seen  # the parent's index entry is waited for too


# -- last: no CROSSSLOT, ever ----------------------------------------------------------------------

SCRIPT_COMMANDS = ("cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro")


def test_no_node_answered_crossslot_to_any_operation_of_the_module(
    cluster: EmbeddedCluster, cluster_registry: Registry
) -> None:
    # This module's operations ran on this cluster before; run each kind once more here, so the
    # check means something when this test runs alone.
    handle = completed_source(cluster_registry, "src")
    forks.fork(cluster_registry, "src", "a", request_id="x1")
    forks.fork(cluster_registry, "src", "a", request_id="x1")
    forks.fork_many(cluster_registry, "a", [f"f{i}" for i in range(8)], request_id="x2")
    forks.snapshot(cluster_registry, "f3")
    cluster_registry.append("f3", turn(2))
    lineage.lineage(cluster_registry, "f3")
    lineage.lineage(cluster_registry, "src")
    cluster_registry.events("f3", 2, 7)
    cluster_registry.flush("f3")
    cluster_registry.dispose(handle)
    with pytest.raises(ForkError):
        forks.fork(cluster_registry, "src", "b")

    for node in cluster.nodes:
        with node.client() as c:
            errors = c.info("errorstats")
            commands = c.info("commandstats")
        assert "errorstat_CROSSSLOT" not in errors, (node.port, errors)
        # A script touching another slot fails with an ERR; the only failures allowed are NOSCRIPT
        # (first call of a script on a node), and no command may have been rejected (CROSSSLOT is).
        noscript = errors.get("errorstat_NOSCRIPT", {}).get("count", 0)
        failed = sum(commands.get(name, {}).get("failed_calls", 0) for name in SCRIPT_COMMANDS)
        assert failed == noscript, (node.port, errors, {k: commands[k] for k in SCRIPT_COMMANDS if k in commands})
        rejected = {name: s["rejected_calls"] for name, s in commands.items() if s.get("rejected_calls")}
        assert rejected == {}, (node.port, rejected)
