"""Shared fixtures: a throwaway Redis-compatible server per session, flushed between tests.

On CI (``CI`` set) a skipped test fails the run: a missing server is a failure, never a skip.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from clocks import Clock
from redis import ConnectionPool, Redis

from sessionfork.core.packer import CommandPacker
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer


@pytest.fixture(scope="session")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture
def redis(server: EmbeddedServer) -> Iterator[Redis]:
    # Packed as the clients of ``connections`` pack (``CommandPacker``): the suite runs through it.
    client = Redis.from_pool(ConnectionPool(host="127.0.0.1", port=server.port, command_packer=CommandPacker()))
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def registry(redis: Redis) -> Registry:
    return Registry(redis)


@pytest.fixture
def clock() -> Clock:
    """A clock the test moves by hand (``clocks.Clock``), at ``clocks.T0``."""
    return Clock()


@pytest.fixture
def timed(redis: Redis, clock: Clock) -> Registry:
    """A registry on ``redis`` whose clock is ``clock``."""
    return Registry(redis, clock=clock)


@pytest.fixture
def frozen() -> Iterator[EmbeddedServer]:
    """A server that accepts connections but never answers (SIGSTOP); continued in teardown."""
    with EmbeddedServer() as srv:
        assert srv.process is not None
        srv.process.send_signal(signal.SIGSTOP)
        try:
            yield srv
        finally:
            srv.process.send_signal(signal.SIGCONT)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("CI") and skipped:
        if reporter:
            reporter.write_line(f"CI: {skipped} skipped test(s) count as failures", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
