"""Pausing a shard's queue (``ops.pauses``): RQ's suspension key, one audit entry per action in the
same transaction, and the worker's ``sessionfork_queue_paused`` gauge."""

from __future__ import annotations

from monitoring import monitored
from prometheus_client import generate_latest
from redis import Redis

from sessionfork.core import keys
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import pauses
from sessionfork.ops.metrics import Observer
from sessionfork.protocol import rq_layout


def test_pause_sets_rqs_suspension_key_and_resume_deletes_it(redis: Redis) -> None:
    pauses.pause(redis, "ops")
    assert redis.exists(rq_layout.SUSPENDED) == 1
    assert pauses.is_paused(redis)

    pauses.resume(redis, "ops")
    assert redis.exists(rq_layout.SUSPENDED) == 0
    assert not pauses.is_paused(redis)


def test_each_action_is_audited_newest_first(redis: Redis) -> None:
    pauses.pause(redis, "console 10.0.0.1", "deploy")
    pauses.resume(redis, "console 10.0.0.2")

    entries = pauses.audit(redis, shard=3)
    assert [(e.action, e.actor, e.detail, e.shard) for e in entries] == [
        ("resume", "console 10.0.0.2", "", 3), ("pause", "console 10.0.0.1", "deploy", 3)]
    assert entries[0].time >= entries[1].time > 0


def test_the_change_and_its_audit_entry_are_one_transaction(redis: Redis, server: EmbeddedServer) -> None:
    with monitored(server) as seen:
        pauses.pause(redis, "ops")

    steps = [command.name for command in seen if command.name in ("MULTI", "SET", "XADD", "EXEC")]
    assert steps == ["MULTI", "SET", "XADD", "EXEC"]


def test_the_audit_stream_is_capped(redis: Redis) -> None:
    for _ in range(pauses.AUDIT_MAX + 300):
        pauses.resume(redis, "ops")

    assert pauses.AUDIT_MAX <= redis.xlen(keys.AUDIT_STREAM) < pauses.AUDIT_MAX + 300


def test_the_paused_gauge_reads_the_pause_at_each_scrape(redis: Redis) -> None:
    observer = Observer(queue_depth=lambda: 0, shard=1, paused=lambda: pauses.is_paused(redis))
    assert 'sessionfork_queue_paused{shard="1"} 0.0' in generate_latest(observer.registry).decode()

    pauses.pause(redis, "ops")

    assert 'sessionfork_queue_paused{shard="1"} 1.0' in generate_latest(observer.registry).decode()
