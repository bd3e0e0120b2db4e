"""``sessionfork worker``'s exit status, from real worker processes (issue 10, #12 and "tests that
must become strong"): 0 after a warm stop, whatever the load and wherever the SIGTERM lands; 1 when
RQ's loop stops on an unexpected error (here: a Redis permission the loop needs is revoked).

A SIGTERM used to raise ``StopRequested`` from the signal handler at any instruction: inside
redis-py between a command and its reply (the next command read the stale reply: a garbled
teardown, exit 3) or inside a maintenance pass (swallowed: the worker never stopped). The load test
freezes the server briefly (``DEBUG SLEEP``) under CPU burners, so that the signal lands while the
worker waits on Redis; the in-process test shows the handler itself never raises.
"""

from __future__ import annotations

import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from helpers import SETTINGS, clean_environ, cli_args, start_worker, wait_registered, worker_name
from redis import Redis
from rq.exceptions import StopRequested

from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import acl
from sessionfork.queue import jobs
from sessionfork.queue.outcomes import Outcomes
from sessionfork.queue.requests import Limits
from sessionfork.queue.service import ForkService
from sessionfork.queue.worker import ForkWorker

STOP_BOUND = 15.0  # seconds: an idle worker stops within a second; generous for a loaded machine


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
    svc = ForkService(Registry(redis), Outcomes(redis, ttl=60, stream_maxlen=100), reply_channel="sf:replies",
                      limits=Limits(max_fanout=16))
    worker = ForkWorker([jobs.make_queue(redis, SETTINGS)], service=svc, connection=redis, abandoned_after=30)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.request_stop(signal.SIGTERM, None)  # what SIGTERM runs, here between two Redis calls
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert worker.stop_signalled
    with pytest.raises(StopRequested):  # the next safe point stops the loop
        worker.dequeue_job_and_maintain_ttl(1)


def test_a_worker_whose_loop_fails_exits_1_with_one_error_line(server: EmbeddedServer, redis: Redis) -> None:
    passwords = {user: f"{user}-pw" for user in acl.USERS}
    for line in acl.acl_rules(SETTINGS, passwords):
        redis.execute_command(*shlex.split(line))
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


def test_an_idle_worker_exits_0_on_sigterm(server: EmbeddedServer, redis: Redis) -> None:
    name = worker_name("idle")
    proc = start_worker(server.url, name)
    wait_registered(redis, name)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(STOP_BOUND) == 0
