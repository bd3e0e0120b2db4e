"""Sentinel: two workers and a scheduler reach one server through ``redis+sentinel://``; its
primary is SIGKILLed mid-load; the sentinels promote the replica, and everyone follows without a
restart. Every request submitted before the kill, during the election and after the promotion ends
with exactly one outcome, no child is created twice, and a waiter that waited across the failover
gets its reply, and every child an outcome names is on the promoted primary. An
``AsyncClient.from_url`` client used before the kill forks again after the
promotion, the CLI forks through it, and rq-dashboard's connection (the same URL) reads it.

With asynchronous replication, the last writes the dead primary acknowledged may be missing on the
new one (docs/guarantees.md): a scheduler that has no outcome for a request resubmits it under the
same request id, which is a no-op for any request the new primary still knows. The test does what
that scheduler does and counts the resubmissions that were needed.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis_sentinel_url
from helpers import (
    SETTINGS,
    clean_environ,
    cli_args,
    kill,
    outcome_entries,
    stop,
    turn,
    wait_registered,
    worker_name,
)
from redis import Redis
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFoundError
from redis.sentinel import MasterNotFoundError
from rq.job import Job
from waits import wait_until

from sessionfork.clients.aio import AsyncClient
from sessionfork.clients.client import Client
from sessionfork.core import keys, records
from sessionfork.core.connections import TRANSIENT, async_pool, queue_client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkRequest, ForkResult, Reply
from sessionfork.embedded import EmbeddedSentinel
from sessionfork.embedded.server import free_port
from sessionfork.protocol import enqueue, requests

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

TIMEOUT = 60.0
AFTER = 30  # requests submitted after the promotion
BURST = 200  # requests queued just before the kill


class Submitter(threading.Thread):
    """A scheduler submitting a steady stream of forks of ``src`` until stopped; each request is
    stamped with the phase it was submitted in (a submit failing while no primary answers is
    retried with the same request id)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(queue_client(SETTINGS, url), SETTINGS)
        self.phase = "before"
        self.ids: dict[str, str] = {}  # request id -> phase at the start of its submit
        self.retried = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            phase = self.phase
            request = self.client.request("src")
            self.retried += submit_through(self.client, request)
            assert isinstance(request.request_id, str)
            self.ids[request.request_id] = phase
            self.stopping.wait(0.01)  # pacing: a steady load, not synchronisation

    def in_phase(self, phase: str) -> list[str]:
        return [r for r, p in list(self.ids.items()) if p == phase]


def submit_through(client: Client, request: ForkRequest) -> int:
    """Submit ``request``, again with the same request id while no primary answers (for up to
    ``TIMEOUT`` seconds); returns the number of failed tries."""
    deadline = time.monotonic() + TIMEOUT
    tries = 0
    while True:
        try:
            client.submit(request)
            return tries
        except TRANSIENT:
            tries += 1
            if time.monotonic() > deadline:
                raise


class AsyncScheduler(threading.Thread):
    """An ``AsyncClient.from_url(<Sentinel URL>)`` that forks once before the kill and once
    after the promotion, with the same client."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.used = threading.Event()  # forked once
        self.promoted = threading.Event()
        self.requests: list[ForkRequest] = []
        self.replies: list[Reply] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    async def _run(self) -> None:
        async with AsyncClient.from_url(self.url, SETTINGS, socket_timeout=SETTINGS.socket_timeout,
                                        socket_connect_timeout=SETTINGS.connect_timeout) as client:
            first = await client.request("src")
            await client.submit(first)
            self.requests.append(first)
            self.replies.append(await client.wait(first, TIMEOUT))
            self.used.set()
            await asyncio.to_thread(self.promoted.wait, TIMEOUT)
            # The same client (its pool, its reply subscription) after the promotion.
            later = await client.request("src")
            self.requests.append(later)
            deadline = time.monotonic() + TIMEOUT
            while True:
                try:
                    await client.submit(later)
                    break
                except TRANSIENT:
                    if time.monotonic() > deadline:
                        raise
            self.replies.append(await client.wait(later, TIMEOUT))


def missing(reader: Redis, ids: list[str]) -> list[str]:
    pipe = reader.pipeline(transaction=False)
    for r in ids:
        pipe.hmget(keys.request(r), list(records.OUTCOME_MARKS))
    return [r for r, done in zip(ids, pipe.execute(), strict=True) if not any(done)]


@pytest.mark.slow
def test_workers_and_clients_follow_a_sentinel_promotion_with_exactly_one_outcome_each() -> None:
    started = time.monotonic()
    with EmbeddedSentinel(replicas=1, sentinels=3) as setup:
        url = setup.url
        old_primary, replica = setup.primary.port, setup.replicas[0].port
        assert setup.primary_port() == old_primary
        reader = queue_client(SETTINGS, url)  # the test's own view, through the sentinels too
        registry = Registry(reader)
        registry.append(registry.create("src"), turn(1))
        names = [worker_name("sentinel") for _ in range(2)]
        workers = [subprocess.Popen(cli_args(url, "worker", "--name", n, "--log-level", "WARNING"),
                                    env=clean_environ(), stdin=subprocess.DEVNULL) for n in names]
        submitter = Submitter(url)
        async_scheduler = AsyncScheduler(url)
        dashboard_sentinels, dashboard = redis_sentinel_url.connect(url)  # rq-dashboard's way, same URL
        waiter_client = Client(queue_client(SETTINGS, url), SETTINGS)
        waited: ForkRequest = waiter_client.request("src")
        answer: list[Reply | BaseException] = []

        def wait_across_the_failover() -> None:
            try:
                answer.append(waiter_client.wait(waited, TIMEOUT))
            except BaseException as exc:  # reported by the main thread
                answer.append(exc)

        waiter = threading.Thread(target=wait_across_the_failover, daemon=True)
        try:
            for name in names:
                wait_registered(reader, name, TIMEOUT)
            submitter.start()
            async_scheduler.start()
            wait_until(lambda: async_scheduler.used.is_set() or async_scheduler.error is not None, TIMEOUT,
                       "the asyncio client's first fork")
            wait_until(lambda: reader.xlen(keys.OUTCOME_STREAM) >= 30, TIMEOUT, "the workers to be busy")
            waiter.start()
            direct = setup.primary.client()
            wait_until(lambda: direct.pubsub_numsub(SETTINGS.reply_channel)[0][1] >= 1, TIMEOUT,
                       "the waiter to listen")
            # Where the kill lands: a burst just queued (in one pipeline: batched workers answer
            # requests submitted one by one as fast as they come), so requests are queued or
            # running, in batches, on the primary that dies.
            direct.script_load(enqueue.SOURCE)
            pipe = direct.pipeline(transaction=False)
            for _ in range(BURST):
                request, payload = requests.prepare(waiter_client.request("src"), lambda: uuid.uuid4().hex)
                assert isinstance(request.request_id, str)
                call_keys, args = enqueue.job_call(request.request_id, payload, SETTINGS, datetime.now(UTC))
                pipe.evalsha(enqueue.SHA, len(call_keys), *call_keys, *args)
                submitter.ids[request.request_id] = "before"
            assert pipe.execute() == [1] * BURST
            outstanding = missing(direct, submitter.in_phase("before"))
            direct.close()
            setup.primary.kill()
            submitter.phase = "during"
            killed_at = time.monotonic()
            # One submit certainly starts while the sentinels still name the dead primary (they
            # wait down-after-milliseconds before they even vote): it is held until the promotion.
            assert setup.primary_port() == old_primary
            during = waiter_client.request("src")
            submit_through(waiter_client, during)
            submitter.ids[str(during.request_id)] = "during"
            wait_until(lambda: setup.primary_port() == replica, TIMEOUT, "the sentinels to promote the replica")
            promoted_in = time.monotonic() - killed_at
            async_scheduler.promoted.set()
            submitter.phase = "after"
            wait_until(lambda: len(submitter.in_phase("after")) >= AFTER, TIMEOUT, "submissions after the promotion")
            submitter.stopping.set()
            submitter.join(TIMEOUT)
            waiter_client.submit(waited)  # the waiter has been listening since before the kill
            waiter.join(TIMEOUT)
            async_scheduler.join(TIMEOUT)
            assert async_scheduler.error is None, async_scheduler.error
            # The CLI, given the same URL, forks through the promoted primary.
            cli = subprocess.run(cli_args(url, "fork", "src", "--request-id", "cli-after", "--wait", str(TIMEOUT)),
                                 env=clean_environ(), capture_output=True, timeout=TIMEOUT, check=False)
            assert cli.returncode == 0 and b'"ok":true' in cli.stdout.replace(b" ", b""), cli
            ids = [*submitter.ids, waited.request_id, *(str(r.request_id) for r in async_scheduler.requests),
                   "cli-after"]
            resubmitted: set[str] = set()

            def every_request_has_an_outcome() -> bool:
                lacking = missing(reader, ids)
                for r in lacking:  # what a scheduler does with a request it has no outcome for
                    if not Job.exists(r, connection=reader):  # its enqueue died with the primary
                        resubmitted.add(r)
                        submitter.client.submit(submitter.client.request("src", request_id=r))
                return not lacking

            wait_until(every_request_has_an_outcome, TIMEOUT, f"an outcome for each of {len(ids)} requests",
                       interval=0.2)
            assert all(w.poll() is None for w in workers), "a worker quit during the failover"
        finally:
            submitter.stopping.set()
            codes = [stop(w, TIMEOUT) for w in workers]
        assert codes == [0, 0]
        # The kill landed mid-load, and the replica took over.
        assert outstanding, "every request was answered before the kill: it did not land mid-load"
        assert setup.primary_port() == replica != old_primary
        with setup.replicas[0].client() as promoted:
            assert promoted.info("replication")["role"] == "master"
        phases = Counter(submitter.ids.values())
        assert phases["before"] and phases["during"] and phases["after"] >= AFTER, phases
        # rq-dashboard's connection, opened before the kill, reads the new primary.
        assert dashboard.info("server")["tcp_port"] == replica
        assert any(dashboard.hmget(keys.request(waited.request_id), list(records.OUTCOME_MARKS)))
        dashboard.connection_pool.disconnect()
        for sentinel in dashboard_sentinels.sentinels:
            sentinel.close()
        # Exactly one outcome each, all successes, and one child per request, never two.
        entries = outcome_entries(reader)
        per_request = Counter(e.request for e in entries)
        assert {r: per_request[r] for r in ids} == dict.fromkeys(ids, 1)
        replies = {e.request: e.reply for e in entries}
        failed = {r: replies[r] for r in ids if not (isinstance(replies[r], ForkResult) and replies[r].ok)}
        assert not failed
        children = [replies[r].session.id for r in ids]  # type: ignore[union-attr]
        assert len(set(children)) == len(ids)
        # Every child an outcome names is on the promoted primary (the worker never sends a step's
        # command again after the failover: it runs the step again whole, from the claim).
        index = {member.decode() for member in reader.smembers(keys.session_children("src"))}
        assert index == set(children), {"named, not on the new primary": sorted(set(children) - index),
                                        "on it, named by no outcome": sorted(index - set(children))}
        # The waiter got the one outcome of its request; so did the asyncio client, twice.
        assert len(answer) == 1 and answer[0] == replies[waited.request_id], answer
        assert async_scheduler.replies == [replies[str(r.request_id)] for r in async_scheduler.requests]
        for client in (reader, submitter.client.redis, waiter_client.redis):
            client.close()
    print(f"\nsentinel failover: {len(ids)} requests ({dict(phases)}), {len(outstanding)} outstanding at "
          f"the kill, promotion after {promoted_in:.1f}s, {submitter.retried} submit retries, "
          f"{len(resubmitted)} resubmitted (lost enqueues), {time.monotonic() - started:.1f}s in all")


STOP_BOUND = 3.0
"""Seconds from SIGTERM to exit of an idle worker whose servers are all gone (about 0.5 s here;
over 20 s if the sentinels' own retries ran inside the data connection's)."""


@pytest.mark.serial  # a time bound
def test_a_worker_whose_sentinels_and_servers_are_all_gone_stops_warm_on_sigterm(tmp_path: Path) -> None:
    with EmbeddedSentinel(replicas=1, sentinels=3) as setup:
        name = worker_name("orphan")
        log_path = tmp_path / "worker.log"
        with log_path.open("wb") as log_file:
            worker = subprocess.Popen(cli_args(setup.url, "worker", "--name", name, "--log-level", "INFO"),
                                      env=clean_environ(), stdin=subprocess.DEVNULL, stdout=log_file,
                                      stderr=subprocess.STDOUT)
        try:
            with queue_client(SETTINGS, setup.url) as reader:
                wait_registered(reader, name, TIMEOUT)
            nodes = [*setup.sentinels, setup.primary, *setup.replicas]
            for node in nodes:
                node.kill()
            # Where the kill landed: every node is dead, the worker is still running (its dequeue
            # failed, and its connection retries through sentinels that no longer answer).
            assert all(node.process is not None and node.process.poll() is not None for node in nodes)
            assert worker.poll() is None
            worker.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            try:
                code = worker.wait(4 * STOP_BOUND)
            except subprocess.TimeoutExpired:
                code = None  # still running: reported below, with its log
            took = time.monotonic() - signalled
        finally:
            kill(worker)
    logged = log_path.read_text()
    assert code == 0, (code, logged)
    assert took < STOP_BOUND, f"stopped {took:.1f}s after SIGTERM\n{logged}"
    assert "warm shut down requested" in logged
    assert f"worker {name} stopped with Redis unreachable: not unregistered" in logged, logged
    assert "Traceback" not in logged, logged


@pytest.mark.serial  # a time bound
def test_a_dead_sentinel_is_skipped_at_once_by_both_clients() -> None:
    # Three sentinels that refuse connections (closed ports): discovery fails after one try of
    # each, for the sync and the asyncio pools alike (redis-py 8's default policy, 10 retries with
    # back-off per sentinel, took seconds per discovery, and a discovery runs inside every one of
    # the data connection's own retries).
    ports = [free_port() for _ in range(3)]  # nothing listening
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/sessionfork/0"
    client = queue_client(SETTINGS, url)
    began = time.monotonic()
    with pytest.raises(MasterNotFoundError):
        client.connection_pool.sentinel_manager.discover_master("sessionfork")  # type: ignore[attr-defined]
    took = time.monotonic() - began
    client.close()

    async def discover() -> float:
        pool = async_pool(url, max_connections=2, socket_timeout=1.0, socket_connect_timeout=1.0)
        began = time.monotonic()
        with pytest.raises(AsyncMasterNotFoundError):
            await pool.sentinel_manager.discover_master("sessionfork")  # type: ignore[attr-defined]
        await pool.disconnect()
        return time.monotonic() - began

    took_async = asyncio.run(discover())
    assert took < 0.5 and took_async < 0.5, (took, took_async)


WAIT = 0.5
SLACK = 0.3
"""Seconds a wait may overrun its deadline (a loaded machine; the last read of the store): a wait
that did not bound its reconnections overran by 0.5 s (measured while other tests loaded the
machine, waits overran by 0.01 s at most)."""


@pytest.mark.serial  # a time bound
def test_every_sync_wait_returns_by_its_deadline_across_a_failover_then_answers_the_stored_outcome() -> None:
    # The sentinels wait 4 s before they deem the primary down: the first waits run whole while
    # they still name the dead one, where a read's reconnections
    # (1.5 s of back-off where the deadline does not bound them) would outlast a wait of 0.5 s.
    with EmbeddedSentinel(replicas=1, sentinels=3, down_after_ms=4000) as setup:
        replica = setup.replicas[0]
        client = Client(queue_client(SETTINGS, setup.url), SETTINGS)
        request = client.request("src")
        client.submit(request)  # no worker: no outcome until the test stores one
        with pytest.raises(TimeoutError):
            client.wait(request, 0.2)  # the client's listener, kept for the next waits
        # Where the kill lands: the listener is subscribed on the primary that dies, the client's
        # sentinel manager asks the first sentinel first.
        with setup.primary.client() as direct:
            assert direct.pubsub_numsub(SETTINGS.reply_channel)[0][1] == 1
        old_primary = setup.primary.port
        setup.primary.kill()
        setup.sentinels[0].kill()  # the primary's host took the first sentinel with it (2 of 3 still vote)
        voter = setup.sentinels[1].client(socket_timeout=1.0, decode_responses=True)

        def named_primary() -> int:
            return int(voter.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", setup.service)[1])

        waits: list[tuple[float, bool]] = []  # (seconds, the sentinels still named the dead primary at its start)
        deadline = time.monotonic() + TIMEOUT
        while named_primary() != replica.port or len(waits) < 3:
            before = named_primary() == old_primary
            began = time.monotonic()
            with pytest.raises(TimeoutError):
                client.wait(request, WAIT)
            waits.append((time.monotonic() - began, before))
            assert time.monotonic() < deadline, "no promotion"
        assert any(before for _, before in waits), f"every wait started after the promotion: no race {waits}"
        assert max(took for took, _ in waits) < WAIT + SLACK, waits
        # Once the new primary has the outcome, the wait answers it.
        stored = b'{"type":"fork/result","requestId":"%s","ok":true,"sessions":[]}' % request.request_id.encode()
        with replica.client() as promoted:
            promoted.hset(keys.request(request.request_id), mapping={"outcome": stored})
        began = time.monotonic()
        reply = client.wait(request, 5)
        assert isinstance(reply, ForkResult) and reply.request_id == request.request_id
        assert time.monotonic() - began < 5
        client.close()
        client.redis.close()
        voter.close()
    print(f"\nwaits of {WAIT}s across a failover: {', '.join(f'{took:.2f}s' for took, _ in waits)}")
