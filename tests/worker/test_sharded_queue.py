"""A sharded queue for real: 3 queue servers, a 3-master registry cluster, 2 workers per shard.

Requests from the sync client, the asyncio client and the raw recipe (its own routing code) each
get exactly one outcome, on the shard ``shard_of`` names and on no other; the shards carry an even
share; ``health``, ``stats`` and ``events`` see every shard. Then one shard's server is SIGKILLed
in the middle of a backlog and restarted: its requests wait and then end (one outcome each), while
the other shards' latency is measured before and during the outage.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import running_cluster
from helpers import SETTINGS, clean_environ, cli_args, outcome_entries, stop, turn, wait_registered, worker_name
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.cluster import RedisCluster
from waits import outcome_of, wait_until

from sessionfork.clients.aio import AsyncClient
from sessionfork.clients.client import Client
from sessionfork.core import keys, records
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, Reply
from sessionfork.embedded import EmbeddedCluster, EmbeddedSentinel, EmbeddedServer
from sessionfork.ops.stats import read_sharded
from sessionfork.protocol.shards import shard_of

pytestmark = pytest.mark.serial  # run alone: see pyproject's markers

TIMEOUT = 60.0
SHARDS = 3
PRODUCER = Path(__file__).parent.parent / "data" / "raw_producer.py"
OUTAGE = 2.0
"""Seconds the killed shard stays down while the other shards are measured."""
DURABLE = ["--appendonly", "yes", "--appendfsync", "always"]  # a restarted shard keeps what it acknowledged


@contextmanager
def sharded_deployment() -> Iterator[tuple[EmbeddedCluster, list[EmbeddedServer], list[subprocess.Popen[bytes]]]]:
    with ExitStack() as stack:
        cluster = stack.enter_context(running_cluster(masters=3, replicas=0))
        servers = [stack.enter_context(EmbeddedServer(extra_args=DURABLE)) for _ in range(SHARDS)]
        env = clean_environ(SESSIONFORK_QUEUE_URLS=",".join(s.url for s in servers), SESSIONFORK_CLUSTER="1")
        workers: list[tuple[int, str, subprocess.Popen[bytes]]] = []
        try:
            for shard in range(SHARDS):
                for _ in range(2):
                    name = worker_name(f"shard{shard}")
                    proc = subprocess.Popen(cli_args(cluster.url, "worker", "--shard", str(shard), "--name", name,
                                                     "--log-level", "WARNING"), env=env, stdin=subprocess.DEVNULL)
                    workers.append((shard, name, proc))
            for shard, name, _ in workers:
                with servers[shard].client() as redis:
                    wait_registered(redis, name, TIMEOUT)
            yield cluster, servers, [proc for _, _, proc in workers]
        finally:
            codes = [stop(proc, TIMEOUT) for _, _, proc in workers]
            assert codes == [0] * len(workers), f"worker exit codes {codes}"


def _outcome_marks(redis: Redis, ids: list[str]) -> list[list[Any]]:
    """Each request's outcome fields (``records.OUTCOME_MARKS``: none set while it has no outcome)."""
    pipe = redis.pipeline(transaction=False)
    for rid in ids:
        pipe.hmget(keys.request(rid), list(records.OUTCOME_MARKS))
    return list(pipe.execute())


def ids_on(shard: int, prefix: str, count: int) -> list[str]:
    """``count`` request ids that live on ``shard`` (deterministic: the test never flakes on luck)."""
    found, i = [], 0
    while len(found) < count:
        rid = f"{prefix}-{i:05d}"
        if shard_of(rid, SHARDS) == shard:
            found.append(rid)
        i += 1
    return found


def run_cli(cluster: EmbeddedCluster, servers: list[EmbeddedServer], *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_environ(SESSIONFORK_QUEUE_URLS=",".join(s.url for s in servers), SESSIONFORK_CLUSTER="1")
    return subprocess.run(cli_args(cluster.url, *args), env=env, capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)


def raw_produce(servers: list[EmbeddedServer], request_ids: list[str]) -> list[dict[str, object]]:
    """The any-language recipe, one process per request (all at once), routing by its own code."""
    ports = ",".join(str(s.port) for s in servers)
    procs = [subprocess.Popen([sys.executable, str(PRODUCER), ports, "src", f"child-{rid}", rid],
                              stdout=subprocess.PIPE, env=clean_environ()) for rid in request_ids]
    outs = [proc.communicate(timeout=TIMEOUT)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(procs)
    return [json.loads(out) for out in outs]


async def async_forks(servers: list[EmbeddedServer], request_ids: list[str]) -> list[Reply]:
    async with AsyncClient([AsyncRedis(port=s.port) for s in servers], SETTINGS) as client:
        return await asyncio.gather(*(client.fork("src", session_id=f"child-{rid}", request_id=rid, timeout=TIMEOUT)
                                      for rid in request_ids), return_exceptions=True)  # asserted by the caller


def sync_forks(client: Client, request_ids: list[str]) -> list[float]:
    """Fork each id in turn with the sync client; the latency of each (seconds)."""
    latencies = []
    for rid in request_ids:
        began = time.perf_counter()
        reply = outcome_of(lambda rid=rid: client.fork("src", session_id=f"child-{rid}", request_id=rid,
                                                       timeout=TIMEOUT))
        latencies.append(time.perf_counter() - began)
        assert isinstance(reply, ForkResult) and reply.ok, reply
    return latencies


def check_one_outcome_each_on_its_shard(servers: list[EmbeddedServer], request_ids: list[str]) -> list[int]:
    """Every id: one outcome stream entry and one stored outcome, on its own shard, none elsewhere.
    Returns the entries per shard."""
    per_shard = []
    for index, server in enumerate(servers):
        with server.client() as redis:
            entries = Counter(e.request for e in outcome_entries(redis))
            mine = {rid for rid in request_ids if shard_of(rid, SHARDS) == index}
            assert {rid for rid in request_ids if entries[rid]} == mine, f"shard {index} holds another's outcome"
            assert all(entries[rid] == 1 for rid in mine), f"shard {index}: an id with several outcomes"
            pipe = redis.pipeline(transaction=False)
            for rid in request_ids:
                pipe.exists(keys.request(rid))
            assert [rid for rid, n in zip(request_ids, pipe.execute(), strict=True) if n] == \
                [rid for rid in request_ids if rid in mine]
            per_shard.append(sum(entries.values()))
    return per_shard


@pytest.mark.slow
def test_a_sharded_queue_routes_every_request_to_one_shard_and_a_dead_shard_stalls_only_its_own() -> None:
    with sharded_deployment() as (cluster, servers, workers):
        registry = Registry(RedisCluster.from_url(cluster.url))
        registry.append(registry.create("src"), turn(1))
        client = Client.from_urls([s.url for s in servers], SETTINGS)

        # -- every producer, every request one outcome on its own shard ----------------------------
        sync_ids = [f"sync-{i:04d}" for i in range(90)]
        async_ids = [f"aio-{i:04d}" for i in range(90)]
        raw_ids = [f"raw-{i:04d}" for i in range(12)]
        sync_forks(client, sync_ids)
        assert all(isinstance(r, ForkResult) and r.ok for r in asyncio.run(async_forks(servers, async_ids)))
        raws = raw_produce(servers, raw_ids)
        assert [r["requestId"] for r in raws] == raw_ids and all(r["ok"] for r in raws)
        everything = [*sync_ids, *async_ids, *raw_ids]
        per_shard = check_one_outcome_each_on_its_shard(servers, everything)
        share = len(everything) / SHARDS
        assert all(abs(n - share) <= 0.2 * share for n in per_shard), f"uneven shards {per_shard}"
        for rid in everything:
            assert registry.header(f"child-{rid}").parent_session == "src"

        health = run_cli(cluster, servers, "health")
        assert health.returncode == 0, health.stderr
        assert [f"of shard {i}:" in health.stdout for i in range(SHARDS)] == [True] * SHARDS
        stats = json.loads(run_cli(cluster, servers, "stats", "--json").stdout)
        assert stats["total"] == len(everything) and [s["total"] for s in stats["shards"]] == per_shard
        lines = run_cli(cluster, servers, "events", "--json").stdout.splitlines()
        events = [json.loads(line) for line in lines]
        assert sorted(e["requestId"] for e in events) == sorted(everything)
        assert all(e["shard"] == shard_of(e["requestId"], SHARDS) for e in events)
        text = run_cli(cluster, servers, "stats").stdout
        assert all(f"shard {i}: {n} outcomes" in text for i, n in enumerate(per_shard)), text
        follow = read_sharded([s.client() for s in servers], start="$", follow=True, block_ms=300)
        forked = run_cli(cluster, servers, "fork", "src", "--session-id", "child-cli-1", "--request-id", "cli-1")
        assert forked.returncode == 0 and json.loads(forked.stdout)["ok"], forked.stderr
        check_one_outcome_each_on_its_shard(servers, ["cli-1"])
        followed = [ids_on(shard, "follow", 1)[0] for shard in range(SHARDS)]
        sync_forks(client, followed)
        seen = [next(follow) for _ in range(1 + SHARDS)]  # new outcomes only, from every shard, tagged
        assert sorted((o.request_id, o.shard) for o in seen) == sorted(
            (rid, shard_of(rid, SHARDS)) for rid in ["cli-1", *followed])
        everything += ["cli-1", *followed]

        # -- one shard's server dies in the middle of a backlog ------------------------------------
        victim, others = 1, [0, 2]
        measured = [rid for pair in zip(*(ids_on(s, f"lat{s}", 400) for s in others), strict=True) for rid in pair]
        before = sync_forks(client, measured[:40])
        backlog = ids_on(victim, "dead", 300)
        submitted, replies = threading.Event(), []

        async def submit_then_wait() -> None:
            async with AsyncClient([AsyncRedis(port=s.port) for s in servers], SETTINGS) as aio:
                requests = [await aio.request("src", session_id=f"child-{rid}", request_id=rid) for rid in backlog]
                await asyncio.gather(*(aio.submit(r) for r in requests))
                submitted.set()
                replies.extend(await asyncio.gather(*(aio.wait(r, TIMEOUT * 2) for r in requests)))

        waiter = threading.Thread(target=asyncio.run, args=(submit_then_wait(),))
        waiter.start()
        assert submitted.wait(TIMEOUT)
        # The kill lands in the backlog: once its first outcome is in, the shard's workers are frozen
        # for the kill (they drain 300 requests in a fraction of a second), so that some is left.
        own = [proc for i, proc in enumerate(workers) if i // 2 == victim]  # 2 workers a shard, in order
        with servers[victim].client() as probe:
            wait_until(lambda: any(any(fields) for fields in _outcome_marks(probe, backlog)), TIMEOUT,
                       "the backlog's first outcome", 0.001)
        for proc in own:
            os.kill(proc.pid, signal.SIGSTOP)
        servers[victim].kill()
        killed_at = time.time()
        for proc in own:
            os.kill(proc.pid, signal.SIGCONT)
        during: list[float] = []
        while len(during) < 40 or time.time() - killed_at < OUTAGE:  # the other shards, all through the outage
            during += sync_forks(client, [measured[40 + len(during)]])
        measured = measured[:40 + len(during)]
        assert waiter.is_alive() and not replies, "the dead shard's waiters did not wait"
        servers[victim].start()
        restarted_at = time.time()
        waiter.join(TIMEOUT * 2)
        assert not waiter.is_alive()
        assert len(replies) == len(backlog) and all(isinstance(r, ForkResult) and r.ok for r in replies)
        assert all(proc.poll() is None for proc in workers), "a worker quit during the outage"

        check_one_outcome_each_on_its_shard(servers, [*everything, *measured, *backlog])
        with servers[victim].client() as redis:
            times = [int(e.entry_id.split("-")[0]) / 1000 for e in outcome_entries(redis) if e.request in backlog]
        assert min(times) < killed_at and max(times) > restarted_at, "the kill did not land in the backlog"

        p50_before, p50_during = statistics.median(before), statistics.median(during)
        p90_before = statistics.quantiles(before, n=10)[8]
        p90_during = statistics.quantiles(during, n=10)[8]
        print(f"\nother shards' sync fork latency, before / during shard {victim}'s outage: "
              f"p50 {p50_before * 1000:.1f} / {p50_during * 1000:.1f} ms, "
              f"p90 {p90_before * 1000:.1f} / {p90_during * 1000:.1f} ms; "
              f"outage {restarted_at - killed_at:.2f} s, {len(backlog)} requests waited on it")
        assert p50_during <= 3 * p50_before + 0.05, (before, during)
        assert max(during) < restarted_at - killed_at, "another shard's request waited out the outage"


def test_a_worker_refuses_a_shard_out_of_range_or_a_shard_list_that_disagrees() -> None:
    with EmbeddedServer() as a, EmbeddedServer() as b:
        def worker(urls: list[str], *args: str) -> subprocess.CompletedProcess[str]:
            env = clean_environ(SESSIONFORK_QUEUE_URLS=",".join(urls))
            return subprocess.run(cli_args(a.url, "worker", "--burst", *args), env=env, capture_output=True,
                                  text=True, timeout=TIMEOUT, check=False)

        out = worker([a.url, b.url], "--shard", "2")
        assert out.returncode == 2 and "--shard must be between 0 and 1" in out.stderr, out.stderr
        out = worker([a.url, b.url])
        assert out.returncode == 2 and "give the shard to serve" in out.stderr, out.stderr
        assert worker([a.url, b.url], "--shard", "0").returncode == 0  # marks a as shard 0/2
        with a.client() as redis:
            assert redis.get(keys.SHARD_MARKER) == b"0/2"
        out = worker([b.url, a.url], "--shard", "1")  # the same servers, listed in another order
        assert out.returncode == 2 and "is shard 0/2 (sf:shard), but this worker was given shard 1/2" in out.stderr
        out = worker([a.url, b.url, "redis://127.0.0.1:1/0"], "--shard", "0")  # three shards now
        assert out.returncode == 2 and "given shard 0/3" in out.stderr, out.stderr
        assert worker([a.url, b.url], "--shard", "1").returncode == 0

        name = worker_name("only0")
        env = clean_environ(SESSIONFORK_QUEUE_URLS=f"{a.url},{b.url}")
        proc = subprocess.Popen(cli_args(a.url, "worker", "--shard", "0", "--name", name, "--log-level", "WARNING"),
                                env=env, stdin=subprocess.DEVNULL)
        try:
            with a.client() as redis:
                wait_registered(redis, name, TIMEOUT)
            health = subprocess.run(cli_args(a.url, "health"), env=env, capture_output=True, text=True,
                                    timeout=TIMEOUT, check=False)
        finally:
            assert stop(proc, TIMEOUT) == 0
        assert health.returncode == 1, health
        assert f"ok: queue 'sessionfork' of shard 0: 1 worker(s): {name}" in health.stdout
        assert "unhealthy: no worker with a fresh heartbeat on queue 'sessionfork' of shard 1" in health.stderr


def test_both_clients_enqueue_and_wait_for_each_request_on_its_own_shard() -> None:
    with EmbeddedServer() as a, EmbeddedServer() as b, EmbeddedServer() as c:
        servers = [a, b, c]
        sync_ids, async_ids, fork_ids = ([f"{p}-{i}" for i in range(30)] for p in ("s", "a", "f"))
        client = Client.from_urls(",".join(s.url for s in servers), SETTINGS)
        for rid in sync_ids:
            client.submit(client.request("src", request_id=rid))
        with pytest.raises(TimeoutError):  # no worker: the waiter reads the outcome on the id's shard
            client.wait(client.request("src", request_id="s-0"), 0.2)

        async def submit_and_fork() -> None:
            async with AsyncClient.from_urls([s.url for s in servers], SETTINGS) as aio:
                for rid in async_ids:
                    await aio.submit(await aio.request("src", request_id=rid))
                for rid in fork_ids:
                    with pytest.raises(TimeoutError):
                        await aio.fork("src", request_id=rid, timeout=0.05)

        asyncio.run(submit_and_fork())
        for index, server in enumerate(servers):
            with server.client() as redis:
                queued = {q.decode() for q in redis.lrange("rq:queue:sessionfork", 0, -1)}
            want = {rid for rid in [*sync_ids, *async_ids, *fork_ids] if shard_of(rid, SHARDS) == index}
            assert queued == want, f"shard {index}"
        with c.client() as redis:  # an outcome where shard 2's worker writes it: the waiter reads it there
            rid = next(r for r in sync_ids if shard_of(r, SHARDS) == 2)
            reply = b'{"type":"fork/result","requestId":"%s","ok":true,"sessions":[]}' % rid.encode()
            redis.hset(keys.request(rid), mapping={"outcome": reply})
        answer = outcome_of(lambda: client.wait(client.request("src", request_id=rid), 5))
        assert isinstance(answer, ForkResult) and answer.request_id == rid, answer  # read on shard 2


def test_a_shard_behind_sentinel_is_served_and_reached_through_its_sentinel_url() -> None:
    # Three sentinels: the shard's URL has commas of its own, in one comma-separated list everywhere
    # (SESSIONFORK_QUEUE_URLS, Client.from_urls, AsyncClient.from_urls).
    with EmbeddedSentinel(replicas=0, sentinels=3) as sentinel, EmbeddedServer() as plain:
        urls = [sentinel.url, plain.url]
        assert sentinel.url.count(",") == 2
        sync_ids, async_ids = [f"st-s-{i}" for i in range(20)], [f"st-a-{i}" for i in range(20)]
        client = Client.from_urls(",".join(urls), SETTINGS)
        assert len(client.shards) == 2
        for rid in sync_ids:
            client.submit(client.request("src", request_id=rid))

        async def submit() -> None:
            async with AsyncClient.from_urls(",".join(urls), SETTINGS) as aio:
                for rid in async_ids:
                    await aio.submit(await aio.request("src", request_id=rid))

        asyncio.run(submit())
        on_sentinel = [rid for rid in [*sync_ids, *async_ids] if shard_of(rid, 2) == 0]
        with sentinel.primary.client() as redis:
            assert {q.decode() for q in redis.lrange("rq:queue:sessionfork", 0, -1)} == set(on_sentinel)
        env = clean_environ(SESSIONFORK_QUEUE_URLS=",".join(urls))
        done = subprocess.run(cli_args(plain.url, "worker", "--burst", "--shard", "0"), env=env, capture_output=True,
                              text=True, timeout=TIMEOUT, check=False)
        assert done.returncode == 0, done.stderr
        with sentinel.primary.client() as redis:  # no source "src": each its one SESSION_NOT_FOUND outcome
            assert sorted(e.request for e in outcome_entries(redis)) == sorted(on_sentinel)
            assert redis.get(keys.SHARD_MARKER) == b"0/2"
        reply = client.wait(client.request("src", request_id=on_sentinel[0]), 5)
        assert isinstance(reply, ForkFailure) and reply.code == "SESSION_NOT_FOUND"
