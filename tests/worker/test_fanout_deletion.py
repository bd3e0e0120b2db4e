"""A fan-out racing the deletion of its source, with a real worker process.

Decision (docs/wire-format.md): **no hidden partial state** — a fan-out reports every child it
created. When its source is deleted while its children are being created, or before a replay of
it (a retry after its connection dropped), the children created before the deletion stay (they
pinned the source's log: they are whole) and are listed in ``sessions``; every other id is in
``failed`` with ``SESSION_NOT_FOUND``. Only when the request created no child at all is the outcome
a ``fork/error`` ``SESSION_NOT_FOUND``, and then the deleted source's log is freed (no leak).

Each test repeats its race until the interleaving it is about happened (asserted), on fresh ids.
Each child carries the same edit of a few KB: the worker's pipeline of create calls (up to 64
children a call) then spans many of the server's socket reads, and another client's command can
land between two calls (the server runs every complete command of one read before it serves
another client).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from helpers import kill, make_client, start_worker, stop, turn, wait_registered, worker_name
from redis import Redis

from sessionfork.core import keys
from sessionfork.core.registry import DELETED, Registry
from sessionfork.core.wire import ForkFailure, ForkResult, NewEvent, Reply
from sessionfork.embedded import EmbeddedServer

FANOUT = 1024
ROUNDS = 8
EDIT = NewEvent("user/message", {"text": "x" * 4096})
"""Each child's edit: its bytes spread a fan-out's create calls over many reads (see above)."""
TIMEOUT = 60.0


@pytest.fixture
def worker(server: EmbeddedServer, redis: Redis) -> Iterator[subprocess.Popen[bytes]]:
    name = worker_name("fan")
    proc = start_worker(server.url, name)
    try:
        wait_registered(redis, name)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        stop(proc)


def _source(registry: Registry, sid: str) -> list[object]:
    registry.append(registry.create(sid), [*turn(1), *turn(2)])
    return list(registry.events(sid))


def _made_by(redis: Redis, ids: list[str], rid: str) -> list[str]:
    """Those of ``ids`` whose record exists and carries the request id ``rid``, in order."""
    pipe = redis.pipeline(transaction=False)
    for cid in ids:
        pipe.hmget(keys.session(cid), ["header", "req"])
    return [cid for cid, (header, req) in zip(ids, pipe.execute(), strict=True)
            if header is not None and req == rid.encode()]


def _wait_first_child(redis: Redis, sid: str) -> None:
    # A tight poll (no sleep): the fan-out's pipeline takes a few milliseconds on the server.
    deadline = time.monotonic() + TIMEOUT
    while not redis.scard(keys.session_children(sid)):
        assert time.monotonic() < deadline, "the fan-out never created a child"


def _check_reported(redis: Redis, registry: Registry, reply: Reply, ids: list[str], rid: str, src: str,
                    expected: list[object]) -> list[str]:
    """The outcome names exactly the children the request made; the rest failed SESSION_NOT_FOUND;
    the deleted source's log is kept exactly while children pin it. Returns the children made."""
    made = _made_by(redis, ids, rid)
    if isinstance(reply, ForkFailure):
        assert reply.code == "SESSION_NOT_FOUND", reply
        assert made == []  # nothing hidden
    else:
        assert isinstance(reply, ForkResult)
        assert [h.id for h in reply.sessions or []] == made  # every child made is reported
        failed = reply.failed or []
        assert [f.session_id for f in failed] == [c for c in ids if c not in made]
        assert {f.code for f in failed} <= {"SESSION_NOT_FOUND"}
        assert reply.ok == (not failed)
    fresh = Registry(redis)
    for cid in made[:: max(1, len(made) // 16)]:
        events = fresh.events(cid)
        assert events[:-1] == expected and (events[-1].type, events[-1].data) == (EDIT.type, EDIT.data)  # whole
    assert set(fresh.children(src)) == set(made)
    assert bool(redis.exists(keys.session_log(src))) == bool(made)  # kept while pinned, else freed
    for cid in made:
        registry.delete(cid)
    assert not redis.exists(keys.session_log(src), keys.session_children(src))  # freed with the last one
    return made


def test_a_deletion_during_a_fan_out_leaves_no_hidden_child_and_no_leaked_log(
        redis: Redis, registry: Registry, worker: subprocess.Popen[bytes]) -> None:
    client = make_client(redis)
    partial = 0
    for k in range(ROUNDS):
        src, rid = f"del-src-{k}", f"del-fan-{k}"
        expected = _source(registry, src)
        ids = [f"del-{k}-{i}" for i in range(FANOUT)]
        request = client.request(src, session_ids=ids, request_id=rid, edits=[EDIT])
        client.submit(request)
        _wait_first_child(redis, src)
        first = {c.decode() for c in redis.smembers(keys.session_children(src))}  # made before the deletion
        assert registry.delete(src) == DELETED
        reply = client.wait(request, TIMEOUT)
        made = _check_reported(redis, registry, reply, ids, rid, src, expected)
        assert first and first <= set(made), (sorted(first)[:3], reply)  # children the deletion met stay
        partial += 0 < len(made) < FANOUT
        if partial:
            break
    assert partial, f"in {ROUNDS} rounds no deletion landed among the children of a fan-out"


def test_a_fan_out_replayed_after_its_source_was_deleted_reports_the_children_it_made(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    client = make_client(redis)
    replayed = 0
    for k in range(ROUNDS):
        src, rid = f"rep-src-{k}", f"rep-fan-{k}"
        expected = _source(registry, src)
        ids = [f"rep-{k}-{i}" for i in range(FANOUT)]
        request = client.request(src, session_ids=ids, request_id=rid, edits=[EDIT])
        client.submit(request)
        name = worker_name("doomed")
        doomed = start_worker(server.url, name)
        try:
            _wait_first_child(redis, src)
            # Freeze the worker and drop its connections (Redis discards the rest of its pipeline),
            # then kill it: it never re-sends, and another worker replays the request.
            os.kill(doomed.pid, signal.SIGSTOP)
            redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        finally:
            kill(doomed)
        before = _made_by(redis, ids, rid)
        landed = 0 < len(before) < FANOUT and redis.hget(keys.request(rid), "outcome") is None
        if landed:
            assert registry.delete(src) == DELETED  # before the replay
        rescuer = start_worker(server.url, worker_name("rescuer"))
        try:
            reply = client.wait(request, TIMEOUT)
        finally:
            stop(rescuer)
        if not landed:  # the source stays: the request was served whole (before or by the replay)
            assert isinstance(reply, ForkResult) and reply.ok and len(reply.sessions or []) == FANOUT, reply
            continue
        made = _check_reported(redis, registry, reply, ids, rid, src, expected)
        assert made == before  # the replay created nothing more, and reported all of them
        assert isinstance(reply, ForkResult) and not reply.ok
        replayed += 1
        break
    assert replayed, f"in {ROUNDS} rounds the kill never landed mid-fan-out"
