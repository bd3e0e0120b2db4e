"""Queue entries that once killed workers (issue: hostile run), against real worker processes.

Each case puts one poisonous entry on the queue the way a producer with only RPUSH/HSET rights
could, then proves that the worker is alive and serving, that the entry left nothing behind, and,
where the entry names a request id, that the id got its one INVALID_REQUEST outcome.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from helpers import (
    SETTINGS,
    clean_environ,
    cli_args,
    make_client,
    outcome_entries,
    start_worker,
    stop,
    stored_outcome,
    turn,
    wait_registered,
    worker_name,
)
from redis import Redis
from waits import wait_until

from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)


@pytest.fixture
def worker(server: EmbeddedServer, redis: Redis) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    name = worker_name("hostile")
    proc = start_worker(server.url, name)
    wait_registered(redis, name)
    yield name, proc
    assert stop(proc) == 0


def raw_job(redis: Redis, job_id: str, data: str) -> None:
    """A job hash and queue entry written by hand, as the any-language recipe (docs/any-language.md) does."""
    queue = jobs.make_queue(redis, SETTINGS)
    redis.hset(queue.job_class.key_for(job_id), mapping={
        "data": data, "origin": SETTINGS.queue, "status": "queued", "created_at": "2026-11-30T12:00:00.000000Z",
        "enqueued_at": "2026-11-30T12:00:00.000000Z", "timeout": 30, "description": "fork"})
    redis.rpush(queue.key, job_id)


def serves(redis: Redis) -> None:
    """A valid fork after the poison gets its OK reply: the worker lives and takes jobs."""
    registry = Registry(redis)
    source = registry.create()
    registry.append(source, turn(1))
    reply = make_client(redis).fork(source.id, timeout=20)
    assert reply.ok, reply


@pytest.mark.parametrize("args", ["null", "5", '{"a": 1}', '"one string"', "[1]", "[null]", '["a", "b"]'])
def test_any_argument_shape_in_the_job_data_is_refused_and_the_worker_serves_on(
        redis: Redis, worker: tuple[str, subprocess.Popen[bytes]], args: str) -> None:
    job_id = "poison-args"
    raw_job(redis, job_id, f'["sessionfork.jobs.fork",null,{args},{{}}]')
    wait_until(lambda: stored_outcome(redis, job_id) is not None, 20, "the refusal outcome")
    reply = wire.decode_reply(stored_outcome(redis, job_id) or b"")
    assert not reply.ok and reply.code == "INVALID_REQUEST"
    assert "takes exactly one argument" in reply.message
    serves(redis)
    assert worker[1].poll() is None


@pytest.mark.parametrize("kwargs", ["null", "5", "[]", '{"x": 1}'])
def test_any_keyword_shape_in_the_job_data_is_refused(redis: Redis, worker: tuple[str, subprocess.Popen[bytes]],
                                                      kwargs: str) -> None:
    job_id = "poison-kwargs"
    raw_job(redis, job_id, '["sessionfork.jobs.fork",null,["{\\"source\\":\\"nobody\\"}"],' + kwargs + "]")
    wait_until(lambda: stored_outcome(redis, job_id) is not None, 20, "the outcome")
    reply = wire.decode_reply(stored_outcome(redis, job_id) or b"")
    # No keyword arguments (null, []) is a well-formed job: it runs, and the source does not exist.
    assert not reply.ok and reply.code == ("SESSION_NOT_FOUND" if kwargs in {"null", "[]"} else "INVALID_REQUEST")
    serves(redis)


def test_a_non_utf8_queue_entry_is_dropped_and_the_worker_serves_on(
        redis: Redis, worker: tuple[str, subprocess.Popen[bytes]]) -> None:
    queue = jobs.make_queue(redis, SETTINGS)
    redis.rpush(queue.key, b"p\xffq")
    wait_until(lambda: redis.llen(queue.key) == 0, 20, "the worker to take the entry")
    serves(redis)
    assert b"p\xffq" not in redis.lrange(queue.intermediate_queue_key, 0, -1)
    assert worker[1].poll() is None


def test_a_non_utf8_entry_in_the_intermediate_queue_does_not_stop_maintenance(
        redis: Redis, worker: tuple[str, subprocess.Popen[bytes]]) -> None:
    # Left there by a worker killed mid-refusal: every maintenance pass lists this queue.
    queue = jobs.make_queue(redis, SETTINGS)
    redis.rpush(queue.intermediate_queue_key, b"\xfe\xff")
    wait_until(lambda: b"\xfe\xff" not in redis.lrange(queue.intermediate_queue_key, 0, -1), 20,
               "maintenance to drop the entry")
    # Abandoned-job recovery still works afterwards: a job stranded in the intermediate queue
    # (a worker killed between dequeue and start) is requeued and answered.
    client = make_client(redis)
    registry = Registry(redis)
    registry.append(registry.create("stranded-src"), turn(1))
    request = client.request("stranded-src", session_id="stranded-child", request_id="stranded-1")
    payload = wire.encode(request).decode()
    redis.hset(queue.job_class.key_for("stranded-1"), mapping={
        "data": wire.encode([jobs.JOB_FUNCTION, None, [payload], {}]), "origin": SETTINGS.queue,
        "status": "queued", "created_at": "2026-11-30T12:00:00.000000Z", "timeout": 30})
    redis.rpush(queue.intermediate_queue_key, "stranded-1")  # taken from the queue, never started
    assert client.wait(request, 30).ok
    assert worker[1].poll() is None


def test_a_refused_queue_entry_leaves_no_job_hash(redis: Redis, worker: tuple[str, subprocess.Popen[bytes]]) -> None:
    queue = jobs.make_queue(redis, SETTINGS)
    before = set(redis.scan_iter(match="rq:job:*"))
    for i in range(20):
        bad = f"bad.id.{i}"  # a dot is outside RQ's job id rule: RQ refuses to load it
        redis.hset(queue.job_class.key_for(bad), mapping={"status": "queued", "data": "x"})
        redis.rpush(queue.key, bad)
    wait_until(lambda: all(stored_outcome(redis, f"bad.id.{i}") is not None for i in range(20)), 30,
               "20 refusals")
    wait_until(lambda: set(redis.scan_iter(match="rq:job:*")) == before, 10, "no leaked job hash")
    serves(redis)


@pytest.mark.parametrize(("entry", "shown", "with_hash"), [
    (b"a\nb", "a\\nb", True),  # a newline
    (b"a\x00b", "a\\x00b", True),  # a NUL
    (b"p\xffq", "p\\xffq", True),  # not UTF-8
    (b"x:y", "x:y", True),  # RQ would load the job "x" (an execution key)
    (b"no-hash", "no-hash", False),  # RQ would drop it silently
    (b"back\\slash\xe2\x80\xa8", "back\\\\slash\\u2028", True),  # a backslash, a line separator
    (b"L" * 300 + b"\n", "L" * 253 + "...", True),  # longer than any id an outcome shows
])
def test_every_queue_entry_gets_an_invalid_request_outcome_under_its_exact_bytes(
        redis: Redis, worker: tuple[str, subprocess.Popen[bytes]], entry: bytes, shown: str,
        with_hash: bool) -> None:
    queue = jobs.make_queue(redis, SETTINGS)
    job_key = queue.job_class.key_for("").encode() + entry
    if with_hash:  # a job hash without a TTL, as a raw producer writes it
        redis.hset(job_key, mapping={"data": '["sessionfork.jobs.fork",null,["{}"],{}]', "origin": SETTINGS.queue,
                                     "status": "queued", "created_at": "2026-11-30T12:00:00.000000Z"})
    if entry == b"x:y":  # a job "x" exists (not queued): RQ would load and run it for this entry
        redis.hset(queue.job_class.key_for("x"), mapping={
            "data": '["sessionfork.jobs.fork",null,["{\\"source\\":\\"nobody\\"}"],{}]', "origin": SETTINGS.queue,
            "status": "queued", "created_at": "2026-11-30T12:00:00.000000Z", "timeout": 30})
    redis.rpush(queue.key, entry)
    record = keys.request("").encode() + entry
    wait_until(lambda: redis.hexists(record, "outcome"), 20, "the refusal outcome")
    reply = wire.decode_reply(redis.hget(record, "outcome") or b"")
    assert not reply.ok and reply.code == "INVALID_REQUEST" and reply.request_id == shown
    assert 0 < redis.ttl(record) <= SETTINGS.outcome_ttl  # nothing un-expiring
    assert [e.request for e in outcome_entries(redis)] == [shown]
    assert "\n" not in reply.message and "\x00" not in reply.message
    # The outcome is written first, then the entry and its hash are removed (one pipeline): a
    # worker dying in between leaves the entry to be refused again. So both are waited for.
    wait_until(lambda: not redis.exists(job_key), 10, "the job hash to go")
    wait_until(lambda: entry not in redis.lrange(queue.intermediate_queue_key, 0, -1), 10,
               "the entry to leave the intermediate queue")
    serves(redis)
    assert stored_outcome(redis, "x") is None  # no other job ran for the entry
    assert worker[1].poll() is None


def test_a_worker_registers_again_after_the_server_lost_its_data(
        server: EmbeddedServer, redis: Redis, worker: tuple[str, subprocess.Popen[bytes]]) -> None:
    name, _ = worker
    redis.flushall()  # what a restart without persistence leaves: no rq:workers, no worker hash
    wait_registered(redis, name)
    health = subprocess.run(cli_args(server.url, "health"), capture_output=True, text=True, timeout=60,
                            env=clean_environ())
    assert health.returncode == 0, health.stderr
    assert name in health.stdout
    serves(redis)
