"""The clients' bounds. The asyncio client against a frozen server (SIGSTOP: connections
accepted, nothing answered): ``fork`` and ``wait`` raise ``TimeoutError`` by their deadline and
``submit`` within ``SUBMIT_RETRY_FOR``, whether the client comes from ``from_url`` (the settings'
socket time-outs) or wraps a ``redis.asyncio.Redis`` that has no time-outs at all. Both clients'
``from_url``/``from_urls`` give their connections the settings' time-outs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis

from sessionfork.aio import AsyncClient
from sessionfork.client import Client as SyncClient
from sessionfork.core.config import Settings
from sessionfork.embedded import EmbeddedServer
from sessionfork.queue import aio

pytestmark = pytest.mark.serial  # asserts time bounds: run alone (see pyproject's markers)

SLACK = 1.5  # seconds past a deadline: the event loop's and the interpreter's own delays


def took(call: Callable[[AsyncClient], Awaitable[object]], client: Callable[[], AsyncClient]) -> tuple[str, float]:
    """(the ``TimeoutError``'s message, seconds) of ``call`` on a new client; fails if it returns."""
    async def main() -> tuple[str, float]:
        async with client() as c:
            began = time.monotonic()
            with pytest.raises(TimeoutError) as raised:
                await call(c)
            return str(raised.value), time.monotonic() - began
    return asyncio.run(main())


def clients(server: EmbeddedServer) -> dict[str, Callable[[], AsyncClient]]:
    return {
        # from_url: each command bounded by the settings' socket_timeout (longer than the call here).
        "from_url": lambda: AsyncClient.from_url(server.url, Settings(socket_timeout=30, connect_timeout=30)),
        # A redis.asyncio client with no time-outs at all: only the call's own deadline bounds it.
        "no time-outs": lambda: AsyncClient(Redis.from_url(server.url)),
    }


@pytest.mark.parametrize("kind", ["from_url", "no time-outs"])
def test_fork_raises_timeout_error_by_its_deadline(frozen: EmbeddedServer, kind: str) -> None:
    message, seconds = took(lambda c: c.fork("src", timeout=1.0, request_id="r-frozen"), clients(frozen)[kind])
    assert 1.0 <= seconds < 1.0 + SLACK, seconds
    assert message == "no reply to request r-frozen within 1.0s"


@pytest.mark.parametrize("kind", ["from_url", "no time-outs"])
def test_wait_raises_timeout_error_by_its_deadline(frozen: EmbeddedServer, kind: str) -> None:
    async def wait(c: AsyncClient) -> object:
        return await c.wait(await c.request("src", request_id="r-frozen-wait"), timeout=1.0)

    message, seconds = took(wait, clients(frozen)[kind])
    assert 1.0 <= seconds < 1.0 + SLACK, seconds
    assert message == "no reply to request r-frozen-wait within 1.0s"


@pytest.mark.parametrize("kind", ["from_url", "no time-outs"])
def test_submit_raises_timeout_error_within_its_retry_bound(frozen: EmbeddedServer, kind: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aio, "SUBMIT_RETRY_FOR", 1.0)

    async def submit(c: AsyncClient) -> object:
        return await c.submit(await c.request("src", request_id="r-frozen-submit"))

    message, seconds = took(submit, clients(frozen)[kind])
    assert 1.0 <= seconds < 1.0 + SLACK, seconds
    assert message == "request r-frozen-submit not enqueued within 1.0s"


def test_from_url_gives_commands_the_settings_time_outs(server: EmbeddedServer) -> None:
    """The default bounds of a from_url client's connections; a caller's own keyword wins."""
    settings = Settings(socket_timeout=7, connect_timeout=2)
    default = AsyncClient.from_url(server.url, settings).redis.connection_pool.connection_kwargs
    own = AsyncClient.from_urls([server.url], settings, socket_timeout=1).shards[0].connection_pool.connection_kwargs
    assert (default["socket_timeout"], default["socket_connect_timeout"]) == (7, 2)
    assert (own["socket_timeout"], own["socket_connect_timeout"]) == (1, 2)


def test_the_sync_clients_from_urls_gives_commands_the_settings_time_outs(server: EmbeddedServer) -> None:
    client = SyncClient.from_urls(server.url, Settings(socket_timeout=7, connect_timeout=2))
    try:
        kwargs = client.redis.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (7, 2)
    finally:
        client.close()
        client.redis.close()
