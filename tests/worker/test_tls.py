"""TLS: ``rediss://`` URLs with a CA file, for the library's clients and for ``sessionfork worker``.

The bundled server speaks no TLS, so a TLS-terminating proxy (a thread running asyncio, with a
certificate for 127.0.0.1/localhost issued by a throwaway ``trustme`` CA) forwards the decrypted
bytes to the plain embedded server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from helpers import clean_environ, cli_args, make_client, stop, turn, wait_registered, worker_name
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from sessionfork.core.config import Settings
from sessionfork.core.connections import queue_client
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkResult, Header
from sessionfork.embedded import EmbeddedServer

_CHUNK = 64 * 1024


class TLSProxy:
    """Accepts TLS on a free loopback port and pipes each connection to ``127.0.0.1:target_port``."""

    def __init__(self, target_port: int, context: ssl.SSLContext) -> None:
        self.target_port = target_port
        self.context = context
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="tls-proxy", daemon=True)
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> TLSProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise TimeoutError("the TLS proxy did not start listening")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.context))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        opened = [client_w]
        self._writers.add(client_w)
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.target_port)
            opened.append(upstream_w)
            self._writers.add(upstream_w)
            await asyncio.gather(self._pipe(client_r, upstream_w), self._pipe(upstream_r, client_w))
        except OSError:
            pass  # the client or the server went away: this connection ends, nothing else does
        finally:
            self._tasks.discard(task)
            for writer in opened:
                await self._close(writer)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass  # a reset on one side ends this direction; the close below ends the other
        finally:
            writer.close()

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture(scope="module")
def plain() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def proxy(plain: EmbeddedServer, ca: trustme.CA) -> Iterator[TLSProxy]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    tls = TLSProxy(plain.port, context).start()
    try:
        yield tls
    finally:
        tls.stop()


@pytest.fixture
def admin(plain: EmbeddedServer) -> Iterator[Redis]:
    """A plain (no TLS) client on the server behind the proxy, flushed for each test."""
    client = plain.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def tls_url(proxy: TLSProxy) -> str:
    return f"rediss://127.0.0.1:{proxy.port}/0"


@pytest.fixture
def tls_client(tls_url: str, ca_file: str) -> Iterator[Redis]:
    client = queue_client(Settings(tls_ca_file=ca_file), tls_url)
    yield client
    client.close()


def test_queue_client_with_a_ca_file_pings_over_tls(tls_client: Redis) -> None:
    assert tls_client.ping() is True


def test_registry_over_tls_creates_and_forks(tls_client: Redis, admin: Redis) -> None:
    registry = Registry(tls_client)
    registry.append(registry.create("tls-a"), turn(1))

    child = registry.create_child(registry.take_snapshot("tls-a"), "tls-b")

    assert child.parent_session == "tls-a"
    assert child.seed_length == 4
    assert [e.type for e in registry.events("tls-b")] == [e.type for e in turn(1)]
    assert admin.exists("sf:s:{tls-b}") == 1  # it really went through the proxy to the server


def test_worker_over_tls_serves_a_fork_request_sent_over_tls(
        tls_client: Redis, tls_url: str, ca_file: str, admin: Redis, tmp_path: Path) -> None:
    Registry(admin).append(Registry(admin).create("tls-src"), turn(1))
    name = worker_name("tls")
    argv = cli_args(tls_url, "--tls-ca-file", ca_file, "worker", "--name", name, "--log-level", "WARNING")
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(argv, env=clean_environ(), stdin=subprocess.DEVNULL, stderr=log)
    try:
        wait_registered(admin, name)

        reply = make_client(tls_client).fork("tls-src", session_id="tls-child", timeout=10)

        assert isinstance(reply, ForkResult), reply
        assert reply.ok
        assert isinstance(reply.session, Header)
        assert reply.session.parent_session == "tls-src"
        assert admin.hget("sf:s:{tls-child}", "header") is not None
    finally:
        assert stop(proc) == 0
        log.close()


def test_connection_without_the_ca_file_fails_certificate_verification(tls_url: str) -> None:
    client = queue_client(Settings(), tls_url)
    # A failed verification never heals, so one attempt shows it; the client's retry policy would
    # only repeat the same refusal for ~6 s.
    client.set_retry(Retry(NoBackoff(), 0))
    try:
        with pytest.raises(RedisConnectionError) as refused:
            client.ping()
    finally:
        client.close()

    assert "certificate" in str(refused.value).lower()

