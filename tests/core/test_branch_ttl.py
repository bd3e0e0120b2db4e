"""Branches that end on a real server: merged and abandoned branches are disposed once
``SESSIONFORK_BRANCH_TTL`` has passed (never before, never with 0), then deleted by retention as any
disposed session, without one byte of a descendant's or the ancestor's log changing; ``sessionfork
gc --dry-run`` reports them and changes nothing. On a cluster: ``test_compose_cluster``."""

from __future__ import annotations

import subprocess

from clocks import HOUR, T0, Clock
from helpers import clean_environ, cli_args, turn
from redis import Redis
from redis.cluster import RedisCluster

from sessionfork.core import forks, keys, merges
from sessionfork.core.registry import Registry
from sessionfork.core.retention import dispose_ended, run_pass
from sessionfork.embedded import EmbeddedServer


def ended_family(registry: Registry) -> None:
    """"p" (one turn); its children "a" (merged, mode events), "b" (a select's winner: merged),
    "c" (that select's loser: abandoned) and "e" (live), each with a turn of its own; "a1", forked
    from "a" before the merge, with a turn of its own."""
    registry.append(registry.create("p"), turn(1))
    for kid in ("a", "b", "c", "e"):
        forks.fork(registry, "p", kid)
        registry.append(kid, turn(2))
    forks.fork(registry, "a", "a1")
    registry.append("a1", turn(3))
    merges.merge(registry, "p", "a", mode="events", request_id="m-a")
    merges.select(registry, "p", ["b", "c"], "b", mode="summary", summary={"x": 1}, request_id="s-1")


def snapshot(redis: Redis | RedisCluster) -> dict[bytes, bytes | None]:
    """Every key of the server and its serialised value (``DUMP``)."""
    return {key: redis.dump(key) for key in sorted(redis.scan_iter(count=1000))}


def test_ended_branches_are_disposed_once_the_ttl_has_passed_never_before(timed: Registry, clock: Clock) -> None:
    ended_family(timed)
    assert dispose_ended(timed, now_ms=T0 + HOUR - 1, older_than_ms=HOUR) == []
    assert dispose_ended(timed, now_ms=T0 + 100 * HOUR, older_than_ms=0) == []  # 0 keeps them
    before = snapshot(timed.redis)
    due = dispose_ended(timed, now_ms=T0 + HOUR, older_than_ms=HOUR, dry_run=True)
    assert [(d.id, d.state, d.ended_at) for d in due] == [("a", "merged", T0), ("b", "merged", T0),
                                                           ("c", "abandoned", T0)]
    assert all(d.bytes > 0 for d in due) and [d.log_kept for d in due] == [True, False, False]
    assert snapshot(timed.redis) == before  # a dry run changes nothing
    clock.now = T0 + HOUR
    done = dispose_ended(timed, now_ms=T0 + HOUR, older_than_ms=HOUR)
    assert [d.id for d in done] == ["a", "b", "c"]
    states = {sid: timed.state_of(sid) for sid in ("p", "a", "b", "c", "e", "a1")}
    assert {sid: s.state for sid, s in states.items()} == {
        "p": "live", "a": "disposed", "b": "disposed", "c": "disposed", "e": "live", "a1": "live"}
    assert states["a"].merged_into.session == "p" and states["c"].abandoned_by == "s-1"  # type: ignore[union-attr]
    assert timed.redis.zcard(keys.ENDED_INDEX) == 0
    assert timed.redis.zrange(keys.DISPOSED_INDEX, 0, -1, withscores=True) == [
        (b"a", T0 + HOUR), (b"b", T0 + HOUR), (b"c", T0 + HOUR)]
    # Entries for a session that has not ended, or is gone or disposed already: dropped, nothing disposed.
    timed.redis.zadd(keys.ENDED_INDEX, {"e": 0, "ghost": 0, "a": 0})
    assert dispose_ended(timed, now_ms=T0 + 2 * HOUR, older_than_ms=HOUR) == []
    assert timed.state_of("e").state == "live" and timed.redis.zcard(keys.ENDED_INDEX) == 0


def test_a_pass_over_ended_branches_changes_no_descendants_bytes(timed: Registry, clock: Clock) -> None:
    ended_family(timed)
    redis = timed.redis
    kept = {sid: timed.events(sid) for sid in ("p", "a1", "e")}
    raw = {sid: redis.lrange(keys.session_log(sid), 0, -1) for sid in ("p", "a", "a1", "e")}
    merges_index = redis.hgetall(keys.session_merges("p"))
    clock.now = T0 + HOUR
    first = run_pass(timed, now_ms=T0 + HOUR, retention_ms=HOUR, branch_ttl_ms=HOUR)
    assert [d.id for d in first.ended] == ["a", "b", "c"] and first.swept == []  # disposed now: swept later
    clock.now = T0 + 2 * HOUR
    second = run_pass(timed, now_ms=T0 + 2 * HOUR, retention_ms=HOUR, branch_ttl_ms=HOUR)
    assert second.ended == [] and [(s.id, s.log_kept) for s in second.swept] == [
        ("a", True), ("b", False), ("c", False)]
    assert [sid for sid in ("p", "a", "b", "c", "e", "a1") if timed.exists(sid)] == ["p", "e", "a1"]
    # The ancestor holds its own copies of the merged events; the grandchild reads its seed from
    # "a"'s log, which deletion keeps: not one byte of either changed.
    assert {sid: redis.lrange(keys.session_log(sid), 0, -1) for sid in ("p", "a", "a1", "e")} == raw
    assert {sid: Registry(redis).events(sid) for sid in kept} == kept
    assert redis.hgetall(keys.session_merges("p")) == merges_index
    assert not redis.exists(keys.session_log("b"), keys.session_log("c"))  # freed: nothing reads them
    # The grandchild goes too: "a"'s log is freed at last, and the ancestor still reads every event.
    timed.delete("a1")
    assert not redis.exists(keys.session_log("a"))
    assert redis.lrange(keys.session_log("p"), 0, -1) == raw["p"] and Registry(redis).events("p") == kept["p"]


def test_gc_dry_run_reports_ended_branches_and_changes_nothing(server: EmbeddedServer, registry: Registry) -> None:
    ended_family(registry)
    # Ended (as far as the index says) in 1970: due under a one-hour TTL; "b" ended just now: not due.
    registry.redis.zadd(keys.ENDED_INDEX, {"a": 1000, "c": 1000}, xx=True)
    env = clean_environ(SESSIONFORK_BRANCH_TTL=3600)
    before = snapshot(registry.redis)
    dry = subprocess.run(cli_args(server.url, "gc", "--dry-run"), env=env, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [["a", "merged"], ["c", "abandoned"]]
    assert all("(would be disposed: branch TTL)" in line for line in lines[:2])
    held = sum(int(line.split()[4]) for line in lines[:2])
    assert lines[2] == f"2 ended branch(es) would be disposed, holding {held} bytes (freed by retention once it " \
                       "has passed)" and held > 0 and len(lines) == 3  # retention off: nothing deleted
    assert snapshot(registry.redis) == before
    real = subprocess.run(cli_args(server.url, "gc"), env=env, capture_output=True, text=True, timeout=60)
    assert real.returncode == 0, real.stderr
    assert "2 ended branch(es) disposed" in real.stdout
    assert [registry.state_of(sid).state for sid in ("a", "b", "c", "e")] == ["disposed", "merged", "disposed", "live"]
    off = subprocess.run(cli_args(server.url, "gc"), env=clean_environ(SESSIONFORK_BRANCH_TTL=0),
                         capture_output=True, text=True, timeout=60)
    assert off.returncode == 2 and "retention is off" in off.stderr
