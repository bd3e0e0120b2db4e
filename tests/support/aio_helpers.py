"""Helpers of the asyncio client tests (``test_aio_*.py``): real worker processes for a block, a
source session to fork, a client of the test server, and waiting on the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from helpers import SETTINGS, start_worker, stop, wait_registered, worker_name
from redis import Redis

from sessionfork import NewEvent, Registry
from sessionfork.aio import AsyncClient
from sessionfork.embedded import EmbeddedServer


@contextmanager
def workers(server: EmbeddedServer, redis: Redis, n: int) -> Iterator[None]:
    procs = []
    try:
        for _ in range(n):
            name = worker_name("aio")
            procs.append(start_worker(server.url, name))
            wait_registered(redis, name)
        yield
    finally:
        for proc in procs:
            assert stop(proc) == 0


def source(registry: Registry, sid: str = "aio-src") -> str:
    handle = registry.create(sid)
    registry.append(handle, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    return sid


def client_for(server: EmbeddedServer, **kwargs: object) -> AsyncClient:
    return AsyncClient.from_url(server.url, SETTINGS, **kwargs)


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait on the event loop for ``predicate`` with a deadline (a condition, not a sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())
