"""Retention and persist-before-evict on real servers: disposed sessions older than the retention
go (never a live one), by ``sessionfork gc`` and by the workers' maintenance pass; several
sweepers at once; with the persistence backend, a session leaves Redis only once its file is whole,
and the file of a deleted session ends with the ``session/deleted`` line and is never made anew."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any

import pytest
from clocks import HOUR, T0, Clock
from helpers import clean_environ, cli_args, start_worker, stop, turn, wait_registered, worker_name
from racing import report, run
from redis import Redis
from waits import wait_until

from sessionfork.core import forks, keys, merges
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.factories import now_ms
from sessionfork.core.registry import DELETED, UNPERSISTED, Registry
from sessionfork.core.retention import sweep
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops.jsonl import path_for
from sessionfork.ops.persist import JsonlBackend


def population(registry: Registry, clock: Clock) -> None:
    """old-1, old-2 disposed at T0; old-parent disposed at T0 with a live child; fresh disposed an
    hour later; live never disposed."""
    for sid in ("old-1", "old-2", "old-parent", "live", "fresh"):
        registry.append(registry.create(sid), turn(1))
    forks.fork(registry, "old-parent", "kid")
    for sid in ("old-1", "old-2", "old-parent"):
        registry.dispose(sid)
    clock.now = T0 + HOUR
    registry.dispose("fresh")


def test_sweep_deletes_only_disposed_sessions_older_than_the_retention(timed: Registry, clock: Clock) -> None:
    population(timed, clock)
    kid = timed.events("kid")
    due = sweep(timed, now_ms=T0 + HOUR, older_than_ms=HOUR // 2, dry_run=True)
    assert sorted(s.id for s in due) == ["old-1", "old-2", "old-parent"]
    assert all(s.bytes > 0 for s in due) and [s.log_kept for s in due if s.id == "old-parent"] == [True]
    assert all(timed.exists(s.id) for s in due)  # a dry run changes nothing
    done = sweep(timed, now_ms=T0 + HOUR, older_than_ms=HOUR // 2)
    assert done == due
    assert [sid for sid in ("old-1", "old-2", "old-parent", "live", "fresh", "kid") if timed.exists(sid)] == \
        ["live", "fresh", "kid"]
    assert Registry(timed.redis).events("kid") == kid  # the child still reads its whole seed
    later = sweep(timed, now_ms=T0 + 10 * HOUR, older_than_ms=1)
    assert [s.id for s in later] == ["fresh"]
    assert timed.exists("live")  # never a live session, however old


def test_gc_command_dry_run_then_for_real(server: EmbeddedServer, timed: Registry, clock: Clock) -> None:
    population(timed, clock)
    env = clean_environ(SESSIONFORK_RETENTION=1)
    # Disposed at T0 by the test's clock, in 2027: the command's real clock finds none old enough,
    # except these two, disposed (as far as the index says) in 1970.
    timed.redis.zadd(keys.DISPOSED_INDEX, {"old-1": 1000, "old-2": 1000})
    dry = subprocess.run(cli_args(server.url, "gc", "--dry-run"), env=env, capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "old-1" in dry.stdout and "old-2" in dry.stdout and "old-parent" not in dry.stdout
    assert "2 session(s) would be deleted, would free" in dry.stdout
    assert timed.exists("old-1")
    real = subprocess.run(cli_args(server.url, "gc", "--json"), env=env, capture_output=True, text=True, timeout=60)
    assert real.returncode == 0, real.stderr
    assert sorted(json.loads(line)["id"] for line in real.stdout.splitlines()) == ["old-1", "old-2"]
    assert not timed.exists("old-1") and not timed.exists("old-2") and timed.exists("live")
    off = subprocess.run(cli_args(server.url, "gc"), env=clean_environ(SESSIONFORK_BRANCH_TTL=0),
                         capture_output=True, text=True, timeout=60)
    assert off.returncode == 2 and "retention is off" in off.stderr


def test_the_workers_maintenance_pass_sweeps(server: EmbeddedServer, redis: Redis) -> None:
    registry = Registry(redis)
    registry.append(registry.create("gone"), turn(1))
    registry.append(registry.create("stays-live"), turn(1))
    registry.dispose("gone")
    name = worker_name()
    proc = start_worker(server.url, name, SESSIONFORK_RETENTION=1)
    try:
        wait_registered(redis, name)
        wait_until(lambda: not registry.exists("gone"), 30, "the maintenance pass to delete 'gone'")
        assert registry.exists("stays-live")
    finally:
        assert stop(proc) == 0
    with pytest.raises(ForkError) as info:
        registry.create("gone")
    assert info.value.code is ErrorCode.SESSION_ALREADY_EXISTS


def test_the_workers_maintenance_pass_disposes_ended_branches_after_their_ttl(server: EmbeddedServer,
                                                                               redis: Redis) -> None:
    """SESSIONFORK_BRANCH_TTL through a worker process: a branch a select abandoned and the one it
    merged are disposed by the worker's maintenance pass once the TTL has passed; a live branch
    and the parent stay live."""
    registry = Registry(redis)
    registry.append(registry.create("p"), turn(1))
    for cid in ("a", "b", "c"):
        forks.fork(registry, "p", cid)
        registry.append(cid, turn(2))
    merges.select(registry, "p", ["a", "b"], "b", mode="summary", summary="b won")
    name = worker_name()
    proc = start_worker(server.url, name, SESSIONFORK_BRANCH_TTL=1)
    try:
        wait_registered(redis, name)
        wait_until(lambda: registry.state_of("a").state == registry.state_of("b").state == "disposed", 30,
                   "the maintenance pass to dispose the ended branches")
        assert registry.state_of("c").state == registry.state_of("p").state == "live"
    finally:
        assert stop(proc) == 0


def _named_sweeper(url: str, n: int, gate: Any, results: Any) -> None:
    def body() -> list[str]:
        registry = Registry(Redis.from_url(url))
        gate.wait(60)
        out: list[str] = []
        while batch := sweep(registry, now_ms=T0 + HOUR, older_than_ms=1, limit=7):
            out += [s.id for s in batch]
        return out

    report(results, f"sweeper-{n}", body)


def test_several_sweepers_at_once(ctx: SpawnContext, spawned: list[SpawnProcess], server: EmbeddedServer,
                                  timed: Registry, clock: Clock) -> None:
    root = timed.create("root")
    timed.append(root, turn(1))
    chain = ["root"]
    for i in range(40):  # a chain and a fan: deletions release pins up the lineage concurrently
        parent = chain[-1] if i % 2 else "root"
        forks.fork(timed, parent, f"s{i}")
        timed.append(f"s{i}", turn(i + 2))
        chain.append(f"s{i}")
    keep = timed.create("keeper")
    forks.fork(timed, "s39", "survivor")
    expected = timed.events("survivor")
    for sid in chain:
        timed.dispose(sid)
    results = run(ctx, spawned, [(_named_sweeper, (server.url, n)) for n in range(4)])
    deleted = [sid for _, ids in results.values() for sid in ids]
    assert sorted(deleted) == sorted(chain)  # each exactly once, by one sweeper or another
    assert not timed.redis.zcard(keys.DISPOSED_INDEX)
    assert Registry(timed.redis).events("survivor") == expected
    assert timed.exists("keeper") and keep.id == "keeper"
    timed.delete("survivor")
    left_logs = [k for k in timed.redis.scan_iter(match="sf:s:*:log")]
    assert [k.decode() for k in left_logs] == [], "every log freed once the last descendant went"


# -- persist before evict -------------------------------------------------------------------------------


@pytest.fixture
def backend_thread(registry: Registry, tmp_path: Path) -> Iterator[JsonlBackend]:
    backend = JsonlBackend(registry, tmp_path / "jsonl", consumer="c1", block_ms=10)
    halt = threading.Event()
    thread = threading.Thread(target=backend.run, args=(halt,), daemon=True)
    thread.start()
    yield backend
    halt.set()
    thread.join(30)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_deletion_waits_for_the_file_and_marks_it(registry: Registry, backend_thread: JsonlBackend) -> None:
    handle = registry.create("p1", cwd="/w")
    registry.append(handle, [*turn(1), *turn(2)])
    registry.dispose(handle)
    header = registry.header("p1")
    path = path_for(backend_thread.root, header)

    def deleted_once_persisted() -> bool:
        return registry.delete("p1", persisted_first=True) == DELETED

    wait_until(deleted_once_persisted, 30, "the backend to persist p1, then its deletion")
    wait_until(lambda: path.exists() and lines(path)[-1]["type"] == "session/deleted", 30, "the deleted line")
    content = lines(path)
    assert [line["seq"] for line in content[1:-1]] == list(range(8))  # whole, then marked
    # The file is never made anew: a sync of the id now fails, writing nothing.
    with pytest.raises(ForkError):
        backend_thread.sync("p1")
    assert lines(path) == content


def test_without_the_backend_deletion_that_waits_does_not_delete(registry: Registry) -> None:
    registry.append(registry.create("p2"), turn(1))
    assert registry.delete("p2", persisted_first=True) == UNPERSISTED
    assert registry.exists("p2")


def test_the_cli_delete_waits_for_the_backend_then_gives_up(server: EmbeddedServer, registry: Registry) -> None:
    registry.append(registry.create("p4"), turn(1))
    env = clean_environ(SESSIONFORK_DELETE_AFTER_PERSIST=1)
    out = subprocess.run(cli_args(server.url, "delete", "p4", "--timeout", "0.5"), env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 4 and "persistence backend" in out.stderr
    assert registry.exists("p4")
    registry.mark_persisted("p4", 4)  # as the backend does once the file holds all 4 events
    out = subprocess.run(cli_args(server.url, "delete", "p4"), env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not registry.exists("p4")


def test_the_backend_never_creates_the_file_of_a_deleted_session(registry: Registry, tmp_path: Path) -> None:
    registry.append(registry.create("p3"), turn(1))
    header = registry.header("p3")
    registry.delete("p3")  # before the backend saw it: created, flush, deleted are all pending
    backend = JsonlBackend(registry, tmp_path / "jsonl", consumer="c1", block_ms=10)
    while backend.step():
        pass
    assert not path_for(backend.root, header).exists()


def _careful_sweeper(url: str, n: int, gate: Any, results: Any) -> None:
    def body() -> list[str]:
        registry = Registry(Redis.from_url(url))
        gate.wait(60)
        out: list[str] = []

        def swept_all() -> bool:
            out.extend(s.id for s in sweep(registry, now_ms=now_ms(), older_than_ms=1, limit=5,
                                           persisted_first=True))
            return not registry.redis.zcard(keys.DISPOSED_INDEX)

        wait_until(swept_all, 60, "every disposed session to be persisted, then deleted", interval=0.05)
        return out

    report(results, f"sweeper-{n}", body)


def test_sweepers_racing_the_persistence_backend_lose_nothing(
        ctx: SpawnContext, spawned: list[SpawnProcess], server: EmbeddedServer, registry: Registry,
        tmp_path: Path) -> None:
    root = tmp_path / "jsonl"
    backend = subprocess.Popen(cli_args(server.url, "persist", "--root", str(root), "--log-level", "WARNING"),
                               env=clean_environ(), stdin=subprocess.DEVNULL)
    try:
        headers = {}
        for i in range(30):
            handle = registry.create(f"p{i}", cwd=f"/w{i % 3}")
            registry.append(handle, [*turn(1), *turn(2)])
            if i % 2:
                forks.fork(registry, f"p{i}", f"p{i}.kid")  # pinned: its log stays for the kid
            registry.dispose(handle)
            headers[f"p{i}"] = registry.header(f"p{i}")
        results = run(ctx, spawned, [(_careful_sweeper, (server.url, n)) for n in range(3)])
        deleted = sorted(sid for _, ids in results.values() for sid in ids)
        assert deleted == sorted(headers)  # every one, exactly once
        for sid, header in headers.items():
            path = path_for(root, header)
            wait_until(lambda p=path: p.exists() and lines(p)[-1]["type"] == "session/deleted", 30,
                       f"{sid}'s file to be marked deleted")
            content = lines(path)
            assert [line.get("seq") for line in content[1:-1]] == list(range(8)), sid  # whole
        for i in range(1, 30, 2):
            assert len(Registry(registry.redis).events(f"p{i}.kid")) == 8
    finally:
        assert stop(backend) == 0
