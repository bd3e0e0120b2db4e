"""The asyncio client's connections, as the server lists them (matched by this process's socket
addresses): a thousand concurrent forks over at most four, and every fork answered while they are killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from typing import Any

from aio_helpers import client_for, source, workers
from redis import Redis
from waits import wait_until

from sessionfork import Registry
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.embedded import EmbeddedServer


def local_addresses() -> set[str]:
    """``ip:port`` of every TCP socket this process holds open (Linux ``/proc``): what the server's
    ``CLIENT LIST`` shows as ``addr`` for this process's connections, whatever their names."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    found = set()
    for table, family in (("/proc/self/net/tcp", socket.AF_INET), ("/proc/self/net/tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[9] in inodes:
                    ip_hex, port_hex = fields[1].split(":")
                    raw = bytes.fromhex(ip_hex)
                    # /proc prints each 32-bit word of the address in host (little-endian) order.
                    ip = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    text = socket.inet_ntop(family, ip)
                    found.add(f"{text.removeprefix('::ffff:')}:{int(port_hex, 16)}")
    return found


class Connections:
    """The server's view of the connections this process opened after it was made: counted by the
    process's socket addresses (``CLIENT LIST addr``), never by client name."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.probe = Redis.from_url(server.url, single_connection_client=True)
        self.probe.ping()
        self.before = local_addresses()  # this test's own connections (fixtures, the probe)

    def current(self) -> list[dict[str, Any]]:
        ours = local_addresses() - self.before
        return [c for c in self.probe.client_list() if c["addr"] in ours]

    def close(self) -> None:
        self.probe.close()


def test_a_thousand_concurrent_forks_over_at_most_four_connections(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    """Counted by the process's addresses: a client opening a connection of its own for some
    command (named or not) shows up here."""
    sid = source(registry, "aio-many")
    conns = Connections(server)
    seen: list[int] = []
    ids: set[str] = set()
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.is_set():
            now = conns.current()
            seen.append(len(now))
            ids.update(c["id"] for c in now)
            stop_sampling.wait(0.01)

    async def main() -> list[ForkResult | ForkFailure]:
        async with client_for(server) as client:
            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                return await asyncio.gather(*(client.fork(sid, timeout=120) for _ in range(1000)))
            finally:
                stop_sampling.set()
                sampler.join()

    try:
        with workers(server, redis, 4):
            replies = asyncio.run(main())
        assert all(isinstance(r, ForkResult) for r in replies), [r for r in replies if not r.ok][:3]
        children = {r.session.id for r in replies if isinstance(r, ForkResult) and r.session}
        assert len(children) == 1000 and len({r.request_id for r in replies}) == 1000
        assert set(registry.children(sid)) == children
        assert max(seen) >= 2 and max(seen) <= 4, max(seen)
        assert len(ids) <= 4, ids  # the same connections all along: none opened per command
        wait_until(lambda: conns.current() == [], 5, "the client's connections to close")
    finally:
        conns.close()


FORKS = 500  # the forks of the kill test: enough that its five kills land while replies are still due


KILL_AFTER = (10, 45, 80, 115, 150)
"""The replies after which the test kills every connection of the client."""


def test_every_fork_gets_its_outcome_while_its_connections_are_killed(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    """CLIENT KILL of every connection of the client (commands and subscription), five times while
    500 forks run, half of them on reply channels of their own (SUBSCRIBEs all along): each call
    still returns its own child (a command whose reply was lost is sent again)."""
    sid = source(registry, "aio-kill")
    conns = Connections(server)
    done: list[Any] = []
    landed: list[tuple[int, int]] = []  # (replies in before the kill, connections killed)

    def kill() -> bool:
        # A connection listed may be gone by its KILL (the client was renewing it, as right after
        # the previous kill): then it is tried again, so that each kill lands on connections in use.
        before = len(done)
        killed = sum(conns.probe.client_kill_filter(_id=c["id"]) for c in conns.current())
        if killed >= 1 or before >= FORKS:
            landed.append((before, killed))
            return True
        return False

    async def kill_soon() -> None:
        # Run in the event loop right after a threshold's reply (a thread polling for it could be
        # starved of the GIL while the loop took in every other reply); tried until it hits.
        deadline = asyncio.get_running_loop().time() + 60
        while not kill():
            assert asyncio.get_running_loop().time() < deadline, "a kill to hit a connection in use"
            await asyncio.sleep(0.001)  # the client renews its connections meanwhile

    async def main() -> list[Any]:
        kills: list[asyncio.Task[None]] = []
        async with client_for(server) as client:
            async def one(i: int) -> Any:
                reply = await client.fork(sid, timeout=120, reply_to=f"sf:replies:kill-{i}" if i % 2 else None)
                done.append(reply)
                if len(done) in KILL_AFTER:
                    kills.append(asyncio.create_task(kill_soon()))
                return reply

            replies = await asyncio.gather(*(one(i) for i in range(FORKS)), return_exceptions=True)
            await asyncio.gather(*kills)
            return replies

    try:
        with workers(server, redis, 2):
            replies = asyncio.run(main())
    finally:
        conns.close()
    errors = [r for r in replies if not isinstance(r, ForkResult)]
    assert errors == [], errors[:3]
    # The kills landed mid-run: each with replies still to come, each killing connections in use.
    assert len(landed) == 5 and all(0 < before < FORKS and killed >= 1 for before, killed in landed), landed
    children = {r.session.id for r in replies if isinstance(r, ForkResult) and r.session}
    assert len(children) == FORKS and set(registry.children(sid)) == children
