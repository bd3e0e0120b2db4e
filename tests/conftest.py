"""Shared fixtures: a throwaway Redis-compatible server per session, flushed between tests.

On CI (``CI`` set) a missing server binary is a failure, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis

from sessionfork.embedded import EmbeddedServer
from sessionfork.registry import Registry


@pytest.fixture(scope="session")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture
def redis(server: EmbeddedServer) -> Iterator[Redis]:
    client = server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def registry(redis: Redis) -> Registry:
    return Registry(redis)
