"""``sessionfork worker``'s exit status, from real worker processes: 0 after a warm stop, whatever the
load and wherever the SIGTERM lands; 1 when RQ's loop stops on an unexpected error (here: a Redis
permission the loop needs is revoked).

A handler that raised ``StopRequested`` at any instruction would land inside redis-py between a
command and its reply (the next command reads the stale reply: a garbled teardown, exit 3) or
inside a maintenance pass (swallowed: the worker never stops). The load test
freezes the server briefly (``DEBUG SLEEP``) under CPU burners, so that the signal lands while the
worker waits on Redis; the in-process test shows the handler itself never raises.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    SETTINGS,
    apply_acl,
    clean_environ,
    cli_args,
    make_client,
    start_worker,
    stop,
    stored_outcome,
    wait_registered,
    worker_name,
)
from redis import Redis
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from waits import exited, wait_until

from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import acl
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.request_worker import RequestWorker
from sessionfork.worker.service import RequestService

pytestmark = [pytest.mark.serial, pytest.mark.rq]  # run alone: see pyproject's markers

STOP_BOUND = 15.0  # seconds: four workers stopping under CPU burners and a frozen server
IDLE_STOP = 2.5  # seconds from SIGTERM to exit: "an idle worker stops within a second", plus a loaded machine


@pytest.fixture
def debug_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(extra_args=["--enable-debug-command", "yes"]) as srv:
        yield srv


@pytest.fixture
def burners() -> Iterator[None]:
    """Two CPU-bound processes: the machine is loaded while the workers stop."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for proc in procs:
        proc.kill()
        proc.wait(10)


def test_idle_workers_exit_0_on_sigterm_under_load_wherever_the_signal_lands(
        debug_server: EmbeddedServer, burners: None) -> None:
    statuses: list[int] = []
    with debug_server.client() as admin:
        for _ in range(3):
            names = [worker_name("warm") for _ in range(4)]
            procs = [start_worker(debug_server.url, name) for name in names]
            try:
                for name in names:
                    wait_registered(admin, name, 60)
                for proc in procs:
                    # Freeze the server for 0.3 s and signal the worker meanwhile: it is then waiting on
                    # Redis (a dequeue, a heartbeat or a maintenance pass), wherever it was.
                    freeze = threading.Thread(target=freeze_server, args=(debug_server, 0.3))
                    freeze.start()
                    time.sleep(random.uniform(0.02, 0.2))  # where in the freeze the signal lands, not synchronisation
                    proc.send_signal(signal.SIGTERM)
                    freeze.join(10)
                began = time.monotonic()
                for proc in procs:
                    statuses.append(proc.wait(STOP_BOUND))
                assert time.monotonic() - began < STOP_BOUND
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(10)
    assert statuses == [0] * 12


def freeze_server(server: EmbeddedServer, seconds: float) -> None:
    with server.client() as client:
        client.execute_command("DEBUG", "SLEEP", str(seconds))


def test_the_stop_handler_of_an_idle_worker_never_raises(redis: Redis) -> None:
    svc = RequestService(Registry(redis), Outcomes(redis, ttl=60, stream_maxlen=100), reply_channel="sf:replies",
                      limits=Limits(max_fanout=16))
    worker = RequestWorker([jobs.make_queue(redis, SETTINGS)], service=svc, connection=redis, abandoned_after=30)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.request_stop(signal.SIGTERM, None)  # what SIGTERM runs, here between two Redis calls
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert worker.stop_signalled
    with pytest.raises(StopRequested):  # the next safe point stops the loop
        worker.dequeue_job_and_maintain_ttl(1)


def test_the_command_listener_ends_at_once_when_the_unsubscribe_wakes_it_before_the_stop(redis: Redis) -> None:
    """RQ's command listener (a thread in a 60-second pub/sub read) ends within a second of the
    worker's ``unsubscribe``, even when the ``UNSUBSCRIBE``'s confirmation wakes it before its stop
    flag is cleared: the race, made to happen (the flag's clear waits until the listener's read
    returned once, or 2 s). RQ's order then left it in a new 60-second read, which redis-py 8.2's
    ``stop()`` waited out (SIGTERMed workers killed in CI)."""
    svc = RequestService(Registry(redis), Outcomes(redis, ttl=60, stream_maxlen=100), reply_channel="sf:replies",
                      limits=Limits(max_fanout=16))
    worker = RequestWorker([jobs.make_queue(redis, SETTINGS)], service=svc, connection=redis, abandoned_after=30)
    worker.subscribe()
    thread = worker.pubsub_thread
    assert thread is not None
    woken = threading.Event()
    read = worker.pubsub.get_message

    def get_message(*args: object, **kwargs: object) -> object:
        try:
            return read(*args, **kwargs)
        finally:
            woken.set()

    worker.pubsub.get_message = get_message  # type: ignore[method-assign]
    wait_until(lambda: worker.pubsub.subscribed and thread.is_alive(), 10, "the listener subscribed")
    woken.clear()
    raced = []

    class LateClear(threading.Event):
        def clear(self) -> None:
            raced.append(woken.wait(2))  # True: a read returned before the flag was cleared
            super().clear()

    flag = LateClear()
    flag.set()
    thread._running = flag  # type: ignore[attr-defined]
    began = time.monotonic()
    worker.unsubscribe()
    took = time.monotonic() - began
    assert not thread.is_alive() and took < 5, took
    assert raced == [False]  # the flag was cleared before the confirmation woke the listener
    worker.pubsub.close()


def test_a_worker_whose_loop_fails_exits_1_with_one_error_line(server: EmbeddedServer, redis: Redis) -> None:
    passwords = {user: f"{user}-pw" for user in acl.USERS}
    apply_acl(redis, SETTINGS, passwords)
    redis.execute_command("ACL", "SETUSER", acl.WORKER, "-blmove")  # the loop's dequeue now fails
    try:
        url = f"redis://{acl.WORKER}:{passwords[acl.WORKER]}@127.0.0.1:{server.port}/0"
        out = subprocess.run(cli_args(url, "worker", "--name", worker_name("fails"), "--log-level", "CRITICAL"),
                             env=clean_environ(), capture_output=True, text=True, timeout=60)
    finally:
        for user in acl.USERS:
            redis.execute_command("ACL", "DELUSER", user)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "error: the worker loop stopped unexpectedly (see the log above)"


def blocked_connection(redis: Redis) -> int | None:
    """The id of the connection blocked in the worker's dequeue (the only blocking client here)."""
    for client in redis.client_list():
        if client["cmd"] in BLOCKING and "b" in client["flags"]:
            return int(client["id"])
    return None


BLOCKING = {"blmove", "brpoplpush", "blpop", "brpop"}


def signal_delivered(pid: int, signum: int) -> bool:
    """``signum`` is no longer pending for process ``pid`` (its handler was entered)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    bit = 1 << (signum - 1)
    return not (int(fields["SigPnd"], 16) & bit or int(fields["ShdPnd"], 16) & bit)


def test_an_idle_worker_exits_0_within_2s_of_a_sigterm_landing_while_it_is_blocked_in_redis(
        server: EmbeddedServer, redis: Redis) -> None:
    name = worker_name("idle")
    proc = start_worker(server.url, name)
    try:
        wait_registered(redis, name)
        wait_until(lambda: blocked_connection(redis) is not None, 20, "the worker to block in its dequeue")
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert exited(proc, IDLE_STOP * 4) == 0
        assert time.monotonic() - began < IDLE_STOP
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def parked_job(redis: Redis, request_id: str) -> str:
    """A fork job's hash, saved but on no queue yet (RQ's documented ``Job.create`` and ``save``)."""
    registry = Registry(redis)
    if not redis.exists(keys.session("parked-src")):
        registry.append(registry.create("parked-src"), [NewEvent("turn/start", {}), NewEvent("turn/end", {})])
    payload = wire.encode(make_client(redis).request("parked-src", request_id=request_id)).decode()
    job = Job.create(jobs.JOB_FUNCTION, args=(payload,), id=request_id, connection=redis, origin=SETTINGS.queue,
                     status=JobStatus.QUEUED, serializer=jobs.JSONSerializer)
    job.save()
    return request_id


def test_a_sigterm_does_not_interrupt_the_blocking_dequeue_it_lands_in(server: EmbeddedServer, redis: Redis) -> None:
    """The handler only sets a flag: the dequeue in flight runs on, and a job it returns after the
    signal is finished (RQ's handler raises in the middle of the read: the job is stranded)."""
    queue = jobs.make_queue(redis, SETTINGS)
    landed_while_blocked = 0
    for attempt in range(6):
        name = worker_name("blocked")
        proc = start_worker(server.url, name)
        try:
            wait_registered(redis, name)
            job_id = parked_job(redis, f"parked-{attempt}")
            wait_until(lambda: blocked_connection(redis) is not None, 20, "the worker to block in its dequeue")
            blocked = blocked_connection(redis)
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda pid=proc.pid: signal_delivered(pid, signal.SIGTERM), 10,
                       "the signal to be delivered")
            # Atomically: is the worker still blocked in that same dequeue, and give it the job.
            pipe = redis.pipeline(transaction=True)
            pipe.client_list()
            pipe.rpush(queue.key, job_id)
            clients, _ = pipe.execute()
            still = any(int(c["id"]) == blocked and c["cmd"] in BLOCKING and "b" in c["flags"] for c in clients)
            assert exited(proc, IDLE_STOP * 4) == 0
            if still:  # the dequeue returned the job after the signal: the worker finished it
                landed_while_blocked += 1
                assert stored_outcome(redis, job_id) is not None
                assert wire.decode_reply(stored_outcome(redis, job_id) or b"").ok
                assert job_id not in redis.lrange(queue.intermediate_queue_key, 0, -1)
            else:  # its dequeue had timed out: a stopping worker takes no new job
                assert stored_outcome(redis, job_id) is None
                redis.lrem(queue.key, 0, job_id)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if landed_while_blocked >= 2:
            break
    assert landed_while_blocked >= 2, "the SIGTERM never landed while the worker was blocked"


def test_heartbeat_at_most_once_a_second_and_4_round_trips_per_job(server: EmbeddedServer, redis: Redis) -> None:
    """RQ's bookkeeping riding the request's round trips, the next job's hash read with its dequeue,
    the heartbeat throttled: counted by the server itself
    (``total_reads_processed``: one per round trip; ``HEXISTS``: the worker's own beat). The worker
    takes one request at a time (``SESSIONFORK_BATCH=1``), as it serves a lone request: a batch's
    round trips are the whole batch's (``test_batches.py``)."""
    name = worker_name("rt")
    proc = start_worker(server.url, name, SESSIONFORK_BATCH=1)
    try:
        wait_registered(redis, name)
        registry = Registry(redis)
        registry.append(registry.create("rt-src"), [NewEvent("turn/start", {}), NewEvent("turn/end", {})])
        client = make_client(redis)
        n = 400
        requests = [client.request("rt-src", session_id=f"rt-{i}", request_id=f"rt-{i}") for i in range(n)]
        os.kill(proc.pid, signal.SIGSTOP)  # the queue fills while the worker cannot take anything
        try:
            for request in requests:
                client.submit(request)
            redis.config_resetstat()
            began = time.monotonic()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        polls = [0]

        def done() -> bool:
            polls[0] += 1
            return bool(redis.xlen(keys.OUTCOME_STREAM) >= n)

        wait_until(done, 120, f"{n} outcomes", interval=0.05)
        seconds = time.monotonic() - began
        reads = int(redis.info("stats")["total_reads_processed"]) - polls[0] - 2  # less this test's own
        beats = int(redis.info("commandstats").get("cmdstat_hexists", {"calls": 0})["calls"])
    finally:
        stop(proc)
    assert beats <= seconds + 2, (beats, seconds)
    assert reads / n <= 4.5, reads / n  # dequeue + job hash, start + claim, child, record + finish
