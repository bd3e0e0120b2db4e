"""Shared helpers of the worker and fault tests: worker processes, finished turns, clients, outcomes."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
from redis import Redis
from rq import SimpleWorker
from waits import wait_until

from sessionfork.clients.client import Client
from sessionfork.core import forks, keys, records, wire
from sessionfork.core.config import Settings
from sessionfork.core.merge_steps import Merged, MergeSteps
from sessionfork.core.registry import Registry
from sessionfork.core.specs import MergeSpec, SelectSpec
from sessionfork.core.wire import NewEvent, Reply
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.jobs import fresh_workers, make_queue

WORKER_ENV: Mapping[str, str] = {
    "SESSIONFORK_ABANDONED_AFTER": "2",
    "SESSIONFORK_MAINTENANCE_INTERVAL": "1",
    "SESSIONFORK_WORKER_TTL": "20",
}
"""Short recovery timings for test workers (see ``sessionfork.core.config.ENV``)."""

SETTINGS = Settings(abandoned_after=2, maintenance_interval=1, worker_ttl=20)
"""The settings the test workers run with, for the test side's clients and queues."""


def clean_environ(**env: object) -> dict[str, str]:
    """The process environment minus any sessionfork/Redis setting, plus the test timings and ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONFORK_") and k != "REDIS_URL"}
    return {**base, **WORKER_ENV, **{k: str(v) for k, v in env.items()}}


def worker_name(prefix: str = "w") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def cli_args(url: str | None, *args: str) -> list[str]:
    """The argv of ``sessionfork [--redis-url URL] ARGS...`` run by this interpreter."""
    return [sys.executable, "-m", "sessionfork", *(["--redis-url", url] if url else []), *args]


def run_cli(url: str, *args: str, stdin: str | None = None, wait: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``sessionfork --redis-url URL <args> --wait <wait>`` as an OS process, ``stdin`` on its standard input."""
    return subprocess.run(cli_args(url, *args, "--wait", str(wait)), env=clean_environ(), input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


def run_fork_cli(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``sessionfork fork <args>`` through ``run_cli``."""
    return run_cli(url, "fork", *args, stdin=stdin)


def start_worker(url: str, name: str, **env: object) -> subprocess.Popen[bytes]:
    """Start ``sessionfork worker`` as an OS process (its output goes to the test's captured stderr)."""
    return subprocess.Popen(cli_args(url, "worker", "--name", name, "--log-level", "WARNING"),
                            env=clean_environ(**env), stdin=subprocess.DEVNULL)


def wait_registered(redis: Redis, name: str, timeout: float = 20.0) -> None:
    """Wait until the worker ``name`` has registered with a fresh heartbeat and entered its work loop.

    RQ registers a worker before it installs its SIGTERM handler; the state leaves "started" after.
    """

    def ready() -> bool:
        state = redis.hget(SimpleWorker.redis_worker_namespace_prefix + name, "state")
        return state not in (None, b"started") and name in fresh_workers(redis, SETTINGS)

    wait_until(ready, timeout, f"worker {name} to register and enter its work loop")


@contextmanager
def registered_worker(server: EmbeddedServer, prefix: str) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process on ``server``, registered before it is handed out, stopped after. The
    server is flushed first: a module's worker starts before its first test flushes (a fixture of
    a wider scope is set up first), and must not run what another module left queued."""
    name = worker_name(prefix)
    with server.client() as probe:
        probe.flushall()
    proc = start_worker(server.url, name)
    try:
        with server.client() as probe:
            wait_registered(probe, name)
        yield proc
    finally:
        stop(proc)


def live_client(redis: Redis, worker: subprocess.Popen[bytes]) -> Client:
    """A client of ``redis``, once ``worker`` (a module's worker) is seen still running."""
    assert worker.poll() is None, f"the module's worker exited with {worker.returncode}"
    return make_client(redis)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    """SIGTERM ``proc`` and reap it (SIGKILL when it does not exit in time); returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` (a crash) and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(15)


def turn(n: int) -> list[NewEvent]:
    """The four events of a finished turn ``n``."""
    return [
        NewEvent("turn/start", {"turn": n, "trigger": "user"}),
        NewEvent("user/message", {"text": f"question {n}"}),
        NewEvent("assistant/message", {"text": f"answer {n}"}),
        NewEvent("turn/end", {"turn": n, "reason": {"kind": "completed"}}),
    ]


def family(registry: Registry, parent: str, children: list[str]) -> None:
    """``parent`` with one turn (4 events), each child forked from it with one turn of its own."""
    registry.append(registry.create(parent), turn(1))
    forks.fork_many(registry, parent, children)
    for i, child in enumerate(children):
        registry.append(child, turn(10 + i))


def family_forked_singly(registry: Registry, parent: str, children: list[str]) -> None:
    """As ``family``, each child by a ``forks.fork`` of its own (``family`` forks them in one ``fork_many``)."""
    registry.append(registry.create(parent), turn(1))
    for i, child in enumerate(children):
        forks.fork(registry, parent, child)
        registry.append(child, turn(10 + i))


def queue_of(client: Client) -> Any:
    """The RQ queue ``client`` enqueues on (its first shard's): the sync client itself holds no RQ."""
    return make_queue(client.redis, client.settings)


def make_client(redis: Redis, **settings: Any) -> Client:
    """A scheduler's client on ``redis`` with the test settings (``settings`` override fields)."""
    return Client(redis, msgspec.structs.replace(SETTINGS, **settings) if settings else SETTINGS)


@dataclass(frozen=True)
class OutcomeEntry:
    """One entry of the outcome stream."""

    entry_id: str
    fields: frozenset[str]
    request: str
    code: str
    us: int
    raw: bytes
    reply: Reply


def outcome_entries(redis: Redis) -> list[OutcomeEntry]:
    """Every entry of ``keys.OUTCOME_STREAM``, oldest first, its reply decoded."""
    entries = []
    for entry_id, fields in redis.xrange(keys.OUTCOME_STREAM):
        f = {k.decode(): v for k, v in fields.items()}
        entries.append(OutcomeEntry(
            entry_id=entry_id.decode(), fields=frozenset(f), request=f["requestId"].decode(),
            code=f["code"].decode(), us=int(f["durationUs"]), raw=f["reply"], reply=wire.decode_reply(f["reply"])))
    return entries


def stored_outcome(redis: Redis, request_id: str) -> bytes | None:
    """The outcome stored under the request id as its wire JSON (rebuilt from the compact layout:
    ``records``), or ``None``."""
    reply = records.decode_outcome(request_id, redis.hmget(keys.request(request_id), list(records.STORED_OUTCOME)))
    return None if reply is None else wire.encode(reply)


def session_keys(redis: Redis) -> set[str]:
    """Ids of every session record (``sf:s:{<id>}``; logs and children sets excluded)."""
    out = set()
    for key in redis.scan_iter(match="sf:s:*", count=1000):
        text = key.decode()
        if text.endswith("}"):
            out.add(text[len("sf:s:{"):-1])
    return out


def count_session_keys(redis: Redis) -> int:
    """How many ``sf:s:*`` keys exist (records, logs and children sets)."""
    return sum(1 for _ in redis.scan_iter(match="sf:s:*", count=1000))


LONG_SCRIPT = """
local t0 = redis.call('TIME')
while true do
  local t = redis.call('TIME')
  if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > tonumber(ARGV[1]) * 1000 then return 1 end
end
"""
"""A script that runs for ARGV[1] milliseconds of server time: a server busy with a long script
(past its busy-reply threshold, every other client gets BUSY)."""


def apply_acl(redis: Redis, settings: Settings, passwords: dict[str, str]) -> None:
    """Create sessionfork's ACL users on ``redis`` (a default-user client): ``ops.acl``'s rules, as an
    operator would apply them (``sessionfork acl``'s lines, one ``ACL SETUSER`` each)."""
    from sessionfork.ops import acl

    for line in acl.acl_rules(settings, passwords):
        redis.execute_command(*shlex.split(line))  # type: ignore[no-untyped-call]


def died_before_the_marks(steps: MergeSteps, spec: MergeSpec | SelectSpec) -> Merged:
    """The spec's steps up to its parent's step, as a process that died before the marks left
    them: what the parent's step wrote."""
    class Dies(Exception):
        pass

    def dies(done: list[tuple[MergeSpec, Merged, tuple[str, ...]]]) -> None:
        raise Dies(done[0][1])

    steps._mark_many = dies  # type: ignore[assignment, method-assign]  # this instance's: the process died
    try:
        steps.run_many([spec])
    except Dies as died:
        merged: Merged = died.args[0]
        return merged
    finally:
        del steps._mark_many
    raise AssertionError("the marks were not reached")
