"""``riders.compacted``: a batch's recorded RQ bookkeeping rewritten to fewer commands that leave
every key exactly as the recorded ones do, on a real server (``apply.lua`` runs both)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from redis import Redis
from rq import Queue

from sessionfork.core import lua
from sessionfork.worker.rq_seam import riders
from sessionfork.worker.rq_seam.worker import SeamWorker

pytestmark = pytest.mark.rq  # RQ's recorded bookkeeping: on RQ 2.12 too

KEYS = ("cz:h", "cz:s", "cz:z", "cz:l", b"cz:s")  # the set's name as text and as bytes: one key


def state(redis: Redis) -> dict[bytes, Any]:
    """Every ``cz:*`` key: its type, contents and time to live (seconds)."""
    read: dict[bytes, Callable[[bytes], Any]] = {
        b"hash": redis.hgetall, b"set": redis.smembers, b"list": lambda k: redis.lrange(k, 0, -1),
        b"zset": lambda k: redis.zrange(k, 0, -1, withscores=True)}
    out: dict[bytes, Any] = {}
    for key in sorted(redis.keys("cz:*")):
        kind = redis.type(key)
        out[key] = (kind, read[kind](key), redis.ttl(key))
    return out


def applied(redis: Redis, commands: list[list[Any]]) -> dict[bytes, Any]:
    """The state ``commands`` leave on a flushed server, run by ``apply.lua`` in one call."""
    redis.flushdb()
    words: list[Any] = []
    for command in commands:
        words += [len(command), *command]
    redis.eval(riders.APPLY, 0, *words)
    return state(redis)


def random_commands(rng: random.Random, n: int) -> list[list[Any]]:
    members = ["a", "b", "c", "cz:z"]  # a member that is also a key's name
    out: list[list[Any]] = []
    for _ in range(n):
        key = rng.choice(KEYS)
        name = rng.choice(["HSET", "SADD", "ZADD", "SREM", "ZREM", "EXPIRE", "EXPIRE", "DEL", "RPUSH", "LREM",
                           "ZADDNX"])
        member = rng.choice(members)
        if name == "HSET":
            out.append(["HSET", "cz:h", member, str(rng.randint(0, 3)), rng.choice(members), "v"])
        elif name in ("SADD", "SREM"):
            out.append([name, rng.choice(["cz:s", b"cz:s"]), member])
        elif name == "ZADD":
            out.append(["ZADD", "cz:z", rng.randint(1, 3), member])
        elif name == "ZADDNX":
            out.append(["ZADD", "cz:z", "NX", rng.randint(1, 3), member])
        elif name == "ZREM":
            out.append(["ZREM", "cz:z", member])
        elif name == "EXPIRE":
            out.append(["EXPIRE", key, rng.choice([0, 60, 90, 90])])
        elif name == "DEL":
            out.append(["DEL", key])
        elif name == "RPUSH":
            out.append(["RPUSH", "cz:l", member])
        else:
            out.append(["LREM", "cz:l", 1, member])
    return out


def test_compacted_commands_leave_every_key_as_the_recorded_ones_do(redis: Redis) -> None:
    rng = random.Random(31)
    joined = 0
    for _ in range(300):
        commands = random_commands(rng, rng.randint(1, 14))
        short = riders.compacted(commands)
        joined += len(commands) - len(short)
        assert applied(redis, short) == applied(redis, commands), commands
    assert joined > 100  # the rewrite did join and drop commands, not only copy them


@pytest.mark.parametrize("jobs", [1, 4])
def test_a_batchs_start_writes_each_shared_registry_once(redis: Redis, jobs: int) -> None:
    queue = Queue("cz", connection=redis)
    batch = [queue.enqueue("bench.measure.noop", job_id=f"cz-{i}") for i in range(jobs)]
    worker = SeamWorker([queue], connection=redis, batch=32)
    scratch = redis.pipeline(transaction=False)
    worker.start_many(batch, queue, scratch)
    recorded = [list(args) for args, _ in scratch.command_stack]
    short = riders.compacted(recorded)
    started = queue.started_job_registry.key
    assert sum(1 for c in recorded if c[0] == "ZADD" and c[1] == started) == jobs
    assert sum(1 for c in short if c[0] == "ZADD" and c[1] == started) == 1
    assert len(short) <= len(recorded) - (jobs - 1)
    words = riders.recorded(scratch)
    lua.add_text(pipe := redis.pipeline(transaction=False), riders.APPLY, words)
    pipe.execute()
    members: list[bytes] = redis.zrange(started, 0, -1)
    assert {m.decode().split(":")[0] for m in members} == {f"cz-{i}" for i in range(jobs)}
