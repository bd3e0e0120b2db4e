"""What the sync client, the asyncio client and ``sessionfork fork --wait`` share: the answer is the
stored outcome (a published message only wakes a waiter), bad requests are refused before any I/O,
and one rule picks the reply channel. Against a real server; workers are real processes."""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aio_helpers import until
from helpers import (
    SETTINGS,
    clean_environ,
    cli_args,
    make_client,
    start_worker,
    stop,
    stored_outcome,
    turn,
    wait_registered,
    worker_name,
)
from redis import Redis
from waits import araised, outcome_of, raised, wait_until

from sessionfork.aio import AsyncClient
from sessionfork.client import Client
from sessionfork.clients.waiting import wait_for_reply
from sessionfork.core import wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkRequest, ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import acl
from sessionfork.protocol import requests
from sessionfork.protocol.outcomes import OUTCOME_FIELDS, verdict
from sessionfork.worker import service
from sessionfork.worker.outcomes import Outcomes

FORGED_CHILD = "forged-child"


def forged(request_id: str) -> bytes:
    """A well-formed success for ``request_id`` naming a child that does not exist."""
    header = Header(version=1, id=FORGED_CHILD, created_at=1, parent_session="s", seed_length=1)
    return wire.encode(ForkResult(request_id=request_id, session=header))


def publish_when_heard(redis: Redis, channel: str, data: bytes) -> None:
    """Publish ``data`` once some client listens on ``channel`` (its SUBSCRIBE took effect)."""
    wait_until(lambda: redis.pubsub_numsub(channel)[0][1] >= 1, 10, f"a subscriber on {channel}")
    assert redis.publish(channel, data) >= 1  # delivered: the waiter has the forged message


class CountingRedis(Redis):
    """A sync client counting its stored-outcome reads (``HMGET sf:req:<id> digest outcome``)."""

    reads = 0

    def hmget(self, name: Any, keys_: Any, *args: Any) -> Any:  # type: ignore[override]
        CountingRedis.reads += 1
        return super().hmget(name, keys_, *args)


# -- a forged reply is never an answer ------------------------------------------------------------


def test_sync_client_ignores_a_forged_reply_and_answers_the_stored_outcome(server: EmbeddedServer,
                                                                          redis: Redis) -> None:
    """No worker: a well-formed ``fork/result`` published on the reply channel wakes the waiter,
    which reads the store, finds nothing and waits on; the genuine outcome recorded later is the
    answer."""
    CountingRedis.reads = 0
    counting = CountingRedis.from_url(server.url)
    client = make_client(counting)
    request = client.request("s", request_id="forge-sync", session_id="c")
    client.submit(request)
    answers: list[Any] = []
    waiter = threading.Thread(target=lambda: answers.append(client.wait(request, 30)))
    waiter.start()
    try:
        wait_until(lambda: CountingRedis.reads >= 1, 10, "the waiter's first read of the store")
        publish_when_heard(redis, SETTINGS.reply_channel, forged("forge-sync"))
        wait_until(lambda: CountingRedis.reads >= 2 or not waiter.is_alive(), 10, "the forged message to be read")
        assert answers == [] and waiter.is_alive()  # woken, read the store, found nothing: waits on
        genuine = ForkFailure(request_id="forge-sync", code="SESSION_NOT_FOUND", message='session "s" not found')
        Outcomes(redis, ttl=60, stream_maxlen=100).record(genuine, SETTINGS.reply_channel, digest=wire.digest(request))
    finally:
        waiter.join(30)
        counting.close()
    assert answers == [genuine]


def test_asyncio_client_ignores_a_forged_reply_and_answers_the_stored_outcome(server: EmbeddedServer,
                                                                             redis: Redis) -> None:
    genuine = ForkFailure(request_id="forge-aio", code="SESSION_NOT_FOUND", message='session "s" not found')

    async def main() -> None:
        # recheck_every far above the test: only a wake-up brings a read of the store.
        async with AsyncClient.from_url(server.url, SETTINGS, recheck_every=3600) as client:
            request = await client.request("s", request_id="forge-aio", session_id="c")
            await client.submit(request)
            reads = count_reads(client)
            task = asyncio.create_task(client.wait(request, timeout=60))
            await until(lambda: reads[0] >= 1, 10, "the first read of the store")
            await asyncio.to_thread(publish_when_heard, redis, SETTINGS.reply_channel, forged("forge-aio"))
            # The forged message woke the waiter and its read of the store came back empty: from
            # here on, a waiter that answers from the message has answered already.
            await until(lambda: reads[0] >= 2 or task.done(), 10, "the forged message to wake the waiter")
            Outcomes(redis, ttl=60, stream_maxlen=100).record(genuine, SETTINGS.reply_channel,
                                                             digest=wire.digest(request))
            assert await task == genuine

    asyncio.run(main())


def test_cli_fork_wait_ignores_a_forged_reply(server: EmbeddedServer, redis: Redis) -> None:
    """``sessionfork fork --wait``: a forged success with no worker is a time-out (exit 4), not 0."""
    proc = subprocess.Popen(cli_args(server.url, "fork", "s", "--request-id", "forge-cli", "--wait", "4"),
                            env=clean_environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        publish_when_heard(redis, SETTINGS.reply_channel, forged("forge-cli"))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 4, (out, err)
    assert FORGED_CHILD.encode() not in out and b"no reply to request forge-cli" in err


def test_a_stored_outcome_of_another_request_id_is_no_answer() -> None:
    other = wire.encode(ForkFailure(request_id="other", code="INTERNAL", message="x"))
    assert verdict("mine", [None, other, None, None, None, None], None) is None
    mine = ForkFailure(request_id="mine", code="INTERNAL", message="x")
    assert verdict("mine", [None, wire.encode(mine), None, None, None, None], None) == mine
    assert OUTCOME_FIELDS == ("digest", "outcome", "child", "header", "cwd", "parent")
    # A one-child outcome in the compact layout: the child's id and header fields, under the request id.
    child = Header(version=0, id="c", created_at=5, cwd="/w", parent_session="p", seed_length=2)
    assert verdict("mine", [None, None, b"c", b"[0,5,2]", b"/w", b"p"], None) == ForkResult(request_id="mine",
                                                                                           session=child)


# -- one way to send, one reply-channel rule -----------------------------------------------------


def test_both_clients_refuse_a_request_that_cannot_be_sent_as_json(server: EmbeddedServer, redis: Redis) -> None:
    bad = ForkRequest(source="s\udcff", request_id="enc-1")  # a lone surrogate: no UTF-8 for it
    sync_error = raised(lambda: make_client(redis).submit(bad))
    assert isinstance(sync_error, ForkError) and sync_error.code is ErrorCode.INVALID_REQUEST, repr(sync_error)

    async def main() -> None:
        async with AsyncClient.from_url(server.url, SETTINGS) as client:
            submit_error = await araised(lambda: client.submit(bad))
            assert isinstance(submit_error, ForkError) and submit_error.code is ErrorCode.INVALID_REQUEST, repr(
                submit_error)
            fork_error = await araised(lambda: client.fork("s\udcff", request_id="enc-2", timeout=5))
            assert isinstance(fork_error, ForkError) and fork_error.code is ErrorCode.INVALID_REQUEST, repr(fork_error)
            assert client.replies.waiters == 0

    asyncio.run(main())
    assert redis.keys("*enc-*") == []  # nothing sent


def test_both_clients_are_made_from_one_url(server: EmbeddedServer, redis: Redis) -> None:
    """``Client.from_url`` as ``AsyncClient.from_url``: a client of the server at the URL, each
    command bounded by the settings' socket time-out, enqueuing there."""
    settings = msgspec.structs.replace(SETTINGS, socket_timeout=1.5, queue="from-url")
    sync = Client.from_url(server.url, settings)
    assert sync.settings is settings and len(sync.shards) == 1
    assert sync.redis.connection_pool.connection_kwargs["socket_timeout"] == 1.5
    assert sync.submit(sync.request("s", request_id="url-sync")) == "url-sync"

    async def main() -> None:
        async with AsyncClient.from_url(server.url, settings) as client:
            assert client.redis.connection_pool.connection_kwargs["socket_timeout"] == 1.5
            assert await client.submit(await client.request("s", request_id="url-aio")) == "url-aio"

    asyncio.run(main())
    sync.close()
    assert sorted(redis.lrange("rq:queue:from-url", 0, -1)) == [b"url-aio", b"url-sync"]


def test_both_clients_tell_an_unknown_request_id_from_a_queued_one(server: EmbeddedServer, redis: Redis) -> None:
    """A wait for an id its queue server does not know answers ``REQUEST_NOT_FOUND`` at once; one
    for a request queued (no worker serves its queue) times out: the two are told apart."""
    settings = msgspec.structs.replace(SETTINGS, queue="unserved")
    sync = make_client(redis, queue="unserved")
    queued = sync.submit(sync.request("s", request_id="known-1"))
    began = time.monotonic()
    unknown = raised(lambda: sync.wait("never-sent", 20))
    assert isinstance(unknown, ForkError) and unknown.code is ErrorCode.REQUEST_NOT_FOUND, repr(unknown)
    assert unknown.message == ('request "never-sent" is not known: not queued, running nor answered (never '
                               "enqueued on this queue server, or its outcome expired)")
    assert time.monotonic() - began < 10  # at once, not at the deadline
    assert isinstance(raised(lambda: sync.wait(queued, 0.3)), TimeoutError)
    sync.close()

    async def main() -> None:
        async with AsyncClient.from_url(server.url, settings) as client:
            began = time.monotonic()
            missing = await araised(lambda: client.wait("never-sent", 20))
            assert isinstance(missing, ForkError) and missing.code is ErrorCode.REQUEST_NOT_FOUND, repr(missing)
            assert time.monotonic() - began < 10
            assert isinstance(await araised(lambda: client.wait(queued, 0.3)), TimeoutError)

    asyncio.run(main())
    reply = ForkResult(request_id="known-1", session=Header(version=0, id="late", created_at=1))
    Outcomes(redis, ttl=60, stream_maxlen=10).record(reply, "sf:replies")
    redis.delete("rq:job:known-1")  # its job gone (expired): the stored outcome still answers
    assert outcome_of(lambda: make_client(redis).wait("known-1", 5)) == reply


def test_one_reply_channel_rule_for_clients_and_worker(monkeypatch: pytest.MonkeyPatch, redis: Redis) -> None:
    request = requests.build("s", {"request_id": "r-1"}, str)
    assert requests.reply_channel(request, "sf:replies") == "sf:replies"
    mine = requests.build("s", {"request_id": "r-1", "reply_to": "sf:replies:me"}, str)
    assert requests.reply_channel(mine, "x") == "sf:replies:me"
    # The worker's service picks its channel through the same function.
    seen: list[str] = []
    real = requests.reply_channel

    def spy(req: ForkRequest, default: str) -> str:
        seen.append(real(req, default))
        return seen[-1]

    monkeypatch.setattr(service.requests, "reply_channel", spy)
    svc = service.RequestService.from_settings(Registry(redis), redis,
                                            msgspec.structs.replace(SETTINGS, reply_channel="chan"))
    reply = svc.handle(wire.encode(requests.build("nobody", {"request_id": "r-2"}, str)), "r-2")
    assert isinstance(reply, ForkFailure) and reply.code == "SESSION_NOT_FOUND"
    assert seen == ["chan"]


# -- a replyTo the worker's ACL user may not publish on -------------------------------------------


PASSWORDS = {acl.SCHEDULER: "s-pw", acl.WORKER: "w-pw", acl.HOST: "h-pw", acl.PERSIST: "p-pw",
             acl.CONSOLE: "c-pw"}


@pytest.fixture
def acl_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        admin = srv.client()
        for line in acl.acl_rules(SETTINGS, PASSWORDS):
            admin.execute_command(*shlex.split(line))  # type: ignore[no-untyped-call]
        admin.close()
        yield srv


def test_a_reply_channel_the_acl_forbids_is_logged_once_and_the_outcome_stored(
        acl_server: EmbeddedServer, tmp_path: Any) -> None:
    def url(user: str) -> str:
        return f"redis://{user}:{PASSWORDS[user]}@127.0.0.1:{acl_server.port}/0"

    admin = acl_server.client()
    host = Redis.from_url(url(acl.HOST))
    registry = Registry(host)
    registry.append(registry.create("a"), turn(1))
    name = worker_name("acl-reply")
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cli_args(url(acl.WORKER), "worker", "--name", name, "--log-level", "INFO"),
                                env=clean_environ(), stdin=subprocess.DEVNULL, stderr=log)
        try:
            wait_registered(admin, name)
            client = make_client(admin)  # the default user may listen anywhere; the worker may not publish there
            request = client.request("a", request_id="acl-elsewhere", session_id="acl-child", reply_to="elsewhere")
            client.submit(request)
            started = time.monotonic()
            reply = client.wait(request, 20)  # read from the store: nothing is published
            assert isinstance(reply, ForkResult) and reply.session is not None and reply.session.id == "acl-child"
            assert time.monotonic() - started < 10
            wait_until(lambda: stored_outcome(admin, "acl-elsewhere") is not None, 10, "the outcome")
            # The worker serves on: a request on the reply channel is published as usual.
            assert make_client(admin).fork("a", session_id="acl-child-2", timeout=20).ok
        finally:
            assert stop(proc) == 0
    text = log_path.read_text()
    assert stored_outcome(admin, "acl-elsewhere") is not None
    lines = [line for line in text.splitlines() if "acl-elsewhere" in line and "level=warning" in line]
    assert len(lines) == 1 and "stored but not published on 'elsewhere'" in lines[0], text
    # The line is docs/cluster.md's example, word for word: its template with the
    # request id and channel filled in, and the refusal the page quotes for the server the tests run.
    doc = (Path(__file__).parents[2] / "docs" / "cluster.md").read_text()
    template = re.search(r"`(outcome of request <id> [^`]*)`", " ".join(doc.split()))
    refusal = re.search(r"which the tests run: `([^`]*)`", " ".join(doc.split()))
    assert template is not None and refusal is not None, "docs/cluster.md lost its warning example"
    expected = template.group(1).replace("<id>", "acl-elsewhere").replace("<channel>", "elsewhere")
    event = dict(token.split("=", 1) for token in shlex.split(lines[0]))["event"]  # a logfmt line
    assert event == expected.replace("<the server's refusal>", refusal.group(1)), lines[0]
    assert "Traceback" not in text, text
    host.close()
    admin.close()


# -- helpers --------------------------------------------------------------------------------------


def count_reads(client: AsyncClient) -> list[int]:
    """Count the asyncio client's stored-outcome reads: single ``HMGET`` calls and the ``HMGET`` in
    ``fork``'s enqueue pipeline."""
    reads = [0]
    redis = client.redis
    real_hmget, real_pipeline = redis.hmget, redis.pipeline

    async def hmget(*args: Any, **kwargs: Any) -> Any:
        result = await real_hmget(*args, **kwargs)
        reads[0] += 1
        return result

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        async def execute(*a: Any, **k: Any) -> Any:
            result = await real_execute(*a, **k)
            reads[0] += 1
            return result

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe

    redis.hmget = hmget  # type: ignore[method-assign]
    redis.pipeline = pipeline  # type: ignore[method-assign]
    return reads


def test_sync_waiter_is_woken_by_pub_sub_alone(server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    """``recheck_every`` far above the deadline: the reply comes by its pub/sub wake-up, long
    before the deadline (where the waiter reads the store one last time)."""
    registry.append(registry.create("wake-src"), turn(1))
    name = worker_name("wake")
    proc = start_worker(server.url, name)
    try:
        wait_registered(redis, name)
        client = make_client(redis)
        for i in range(3):
            request = client.request("wake-src", request_id=f"wake-{i}")
            client.submit(request)
            started = time.monotonic()
            reply = wait_for_reply(redis, f"wake-{i}", SETTINGS.reply_channel, 20, digest=wire.digest(request),
                                   recheck_every=3600)
            assert isinstance(reply, ForkResult), reply
            assert time.monotonic() - started < 10
    finally:
        assert stop(proc) == 0
