"""A Redis that stalls or loses its data under a real worker process.

* A script that runs past ``busy-reply-threshold`` makes the server answer ``BUSY`` to everyone:
  the worker treats it like an outage (backs off, runs the step again), never as the request's
  failure or a reason to stop.
* A server SIGKILLed mid-job and restarted empty: the job's bookkeeping rewrites the worker hash,
  yet the worker is in no worker set; it must register again (``health``).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    LONG_SCRIPT,
    SETTINGS,
    clean_environ,
    cli_args,
    kill,
    make_client,
    stored_outcome,
    turn,
    wait_registered,
    worker_name,
)
from redis import Redis
from redis.exceptions import ResponseError
from rq.registry import StartedJobRegistry
from waits import outcome_of, wait_until

from sessionfork.core import keys, wire
from sessionfork.core.config import Settings
from sessionfork.core.connections import queue_client
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol.requests import Limits
from sessionfork.worker import jobs
from sessionfork.worker.jobs import fresh_workers
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.service import RequestService

pytestmark = [pytest.mark.slow, pytest.mark.rq]

FANOUT = 10_000  # children of the job a fault lands in: a second or so of work, a wide window
BUSY_FOR = 3.0  # seconds the long script runs



@pytest.fixture
def busy_server() -> Iterator[EmbeddedServer]:
    # BUSY after 50 ms of script (the default is 5 s): the same reply, sooner.
    with EmbeddedServer(extra_args=["--busy-reply-threshold", "50"]) as srv:
        yield srv


@pytest.fixture
def plain_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        yield srv


def start_logged_worker(url: str, name: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cli_args(url, "worker", "--name", name, "--log-level", "WARNING"),
                                env=clean_environ(SESSIONFORK_MAX_FANOUT=FANOUT), stdin=subprocess.DEVNULL,
                                stderr=out, stdout=out)


@contextlib.contextmanager
def worker_log_on_failure(proc: subprocess.Popen[bytes], log: Path) -> Iterator[None]:
    """A failed assertion inside names the worker's exit status and the end of its log."""
    try:
        yield
    except AssertionError as exc:
        tail = log.read_text(errors="replace")[-20000:] if log.exists() else "(no log)"
        raise AssertionError(f"{exc}\nworker exit status: {proc.poll()}\nworker log:\n{tail}") from None


def in_hand(redis: Redis, job_id: str, name: str) -> bool:
    status, worker = redis.hmget(f"rq:job:{job_id}", ["status", "worker_name"])
    started = StartedJobRegistry(queue=jobs.make_queue(redis, SETTINGS))
    return status == b"started" and worker == name.encode() and job_id in started.get_job_ids(cleanup=False)


def test_a_long_script_makes_the_worker_back_off_not_die(busy_server: EmbeddedServer, tmp_path: Path) -> None:
    redis = queue_client(Settings(), busy_server.url)
    log = tmp_path / "worker.log"
    name = worker_name("busy")
    proc = start_logged_worker(busy_server.url, name, log)
    try:
        wait_registered(redis, name, 60)
        registry = Registry(redis)
        registry.append(registry.create("busy-src"), turn(1))
        client = make_client(redis)
        request = client.request("busy-src", count=FANOUT, request_id="busy-fanout")
        client.submit(request)
        wait_until(lambda: in_hand(redis, "busy-fanout", name), 60, "the worker to take the fan-out", 0.002)
        # Any client's long script, started while the worker is mid-job: its next command gets BUSY.
        with busy_server.client() as other:
            script = threading.Thread(target=other.eval, args=(LONG_SCRIPT, 0, int(BUSY_FOR * 1000)))
            script.start()
            script.join(60)
        reply = outcome_of(lambda: client.wait(request, 60))
        text = log.read_text(errors="replace")
        assert "BUSY" in text, text  # the worker did meet the busy server
        assert isinstance(reply, wire.ForkResult), (reply, text)  # the job in hand was finished, not failed
        assert len(reply.sessions or []) == FANOUT, reply
        assert proc.poll() is None, text
        # ... and it serves on.
        assert client.fork("busy-src", timeout=30).ok
        assert "stopped unexpectedly" not in log.read_text(errors="replace")
    finally:
        kill(proc)
        redis.close()


@pytest.mark.parametrize("reply", [
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "LOADING Redis is loading the dataset in memory",  # a restarting server reading its RDB
])
def test_a_busy_server_on_the_last_attempt_is_retried_not_reported(
        redis: Redis, registry: Registry, monkeypatch: pytest.MonkeyPatch, reply: str) -> None:
    registry.append(registry.create("src"), turn(1))
    svc = RequestService(registry, Outcomes(redis, ttl=60, stream_maxlen=100), reply_channel="sf:replies",
                      limits=Limits(max_fanout=16))
    real = registry.forks.child_step
    calls = {"n": 0}

    def busy_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ResponseError(reply)
        return real(*args, **kwargs)

    monkeypatch.setattr(registry.forks, "child_step", busy_once)
    payload = '{"source":"src","sessionId":"c1"}'
    with pytest.raises(ResponseError):
        svc.handle(payload, "r1", final_attempt=True)
    assert svc.outcomes.get("r1") is None  # not INTERNAL: the worker backs off and runs it again
    assert svc.handle(payload, "r1", final_attempt=True).ok


def test_a_worker_registers_again_when_its_server_loses_its_data_mid_job(
        plain_server: EmbeddedServer, tmp_path: Path) -> None:
    redis = queue_client(Settings(), plain_server.url)
    name = worker_name("amnesia")
    proc = start_logged_worker(plain_server.url, name, tmp_path / "worker.log")
    try:
        wait_registered(redis, name, 60)
        registry = Registry(redis)
        registry.append(registry.create("lost-src"), turn(1))
        client = make_client(redis)
        client.submit(client.request("lost-src", count=FANOUT, request_id="lost-fanout"))
        wait_until(lambda: in_hand(redis, "lost-fanout", name), 60, "the worker to take the fan-out", 0.002)
        plain_server.kill()  # SIGKILL: no persistence, the server comes back empty
        plain_server.start()
        # The kill landed mid-job: the job finished on the empty server (its source is gone now).
        wait_until(lambda: stored_outcome(redis, "lost-fanout") is not None, 60, "the job to end after the restart")
        outcome = wire.decode_reply(stored_outcome(redis, "lost-fanout") or b"")
        assert not outcome.ok and outcome.code == "SESSION_NOT_FOUND", outcome
        # The job's last pipeline (right after its outcome) writes the worker hash again: a hash
        # that exists is no proof of a registration.
        wait_until(lambda: bool(redis.exists(f"rq:worker:{name}")), 10, "the worker hash")
        wait_until(lambda: name in fresh_workers(redis, SETTINGS), 10, "the worker to register again")
        health = subprocess.run(cli_args(plain_server.url, "health"), capture_output=True, text=True,
                                timeout=60, env=clean_environ())
        assert health.returncode == 0 and name in health.stdout, health
        assert proc.poll() is None
        registry.append(registry.create("after"), turn(1))
        assert client.fork("after", timeout=30).ok
        assert redis.hexists(keys.request("lost-fanout"), "outcome")
    finally:
        kill(proc)
        redis.close()


def test_an_idle_worker_registers_again_with_its_state(plain_server: EmbeddedServer, tmp_path: Path) -> None:
    """docs/guarantees.md, "Crashes": a worker whose server lost its data registers again at its
    next heartbeat, as what it is: an idle one comes back "idle" (RQ's registration records no
    state: ``rq info`` would show "?"). The state is written right after the registration, before
    the worker's next heartbeat, so that heartbeat is the condition waited for, not a time."""
    redis = queue_client(Settings(), plain_server.url)
    name = worker_name("idle-amnesia")
    key = f"rq:worker:{name}"
    proc = start_logged_worker(plain_server.url, name, tmp_path / "worker.log")
    try:
        wait_registered(redis, name, 60)
        assert redis.hget(key, "state") == b"idle"
        plain_server.kill()  # SIGKILL: no persistence, the server comes back empty
        plain_server.start()
        with worker_log_on_failure(proc, tmp_path / "worker.log"):
            wait_until(lambda: bool(redis.hexists(key, "birth")), 30, "the worker to register again")
            registered = redis.hget(key, "last_heartbeat")
            wait_until(lambda: redis.hget(key, "last_heartbeat") != registered, 10, "the worker's next heartbeat")
        assert redis.hget(key, "state") == b"idle"
        assert name in fresh_workers(redis, SETTINGS) and proc.poll() is None
    finally:
        kill(proc)
        redis.close()


def test_a_dropped_connection_makes_the_worker_run_its_step_again_never_resend_the_command(
        plain_server: EmbeddedServer, tmp_path: Path) -> None:
    """docs/guarantees.md, "Failover": the worker's clients never send a command again after its
    connection dropped (a command sent again after a promotion would reach a server that may lack
    what the step's earlier commands wrote): the error reaches the worker, which backs off and
    runs its whole step again. The idle worker's connection is killed in its blocking dequeue."""
    redis = queue_client(Settings(), plain_server.url)
    name = worker_name("dropped")
    log = tmp_path / "worker.log"
    proc = start_logged_worker(plain_server.url, name, log)
    try:
        wait_registered(redis, name, 60)
        with worker_log_on_failure(proc, log):
            killed = redis.execute_command("CLIENT", "KILL", "TYPE", "normal")  # every client but this one
            assert killed >= 1  # where the kill landed: the worker's connection, blocked in its dequeue
            wait_until(lambda: "Redis unreachable or busy (ConnectionError" in log.read_text(), 30,
                       "the worker to see the dropped connection itself")
            registry = Registry(redis)
            registry.append(registry.create("src"), turn(1))
            assert make_client(redis).fork("src", timeout=30).ok  # and it serves requests after it
            assert proc.poll() is None
    finally:
        kill(proc)
        redis.close()
