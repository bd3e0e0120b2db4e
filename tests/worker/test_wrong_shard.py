"""A request enqueued on the wrong shard of a sharded queue is refused, never forked.

Two queue servers, a worker process on each, one registry: a producer that routes with another
shard list (here: a client of shard 0's server alone) gets ``WRONG_SHARD`` naming both shards,
stored, streamed and published on that server like any outcome; the same request id then sent
to its own shard makes exactly one child, and a retry there makes none. Without shards every id
is the worker's own (``RequestService`` without ``shard``: every other worker test).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from helpers import SETTINGS, clean_environ, cli_args, outcome_entries, stop, turn, wait_registered, worker_name
from worker_fixtures import next_message, subscribed

from sessionfork.clients.client import Client
from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol.shards import shard_of

TIMEOUT = 30.0


@pytest.fixture(scope="module")
def deployment() -> Iterator[tuple[EmbeddedServer, list[EmbeddedServer]]]:
    """A registry server and two queue shards, each shard served by one worker process."""
    with ExitStack() as stack:
        registry = stack.enter_context(EmbeddedServer())
        shards = [stack.enter_context(EmbeddedServer()) for _ in range(2)]
        env = clean_environ(SESSIONFORK_QUEUE_URLS=",".join(s.url for s in shards))
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for index, shard in enumerate(shards):
                name = worker_name(f"shard{index}")
                procs.append(subprocess.Popen(cli_args(registry.url, "worker", "--shard", str(index), "--name", name,
                                                       "--log-level", "WARNING"), env=env, stdin=subprocess.DEVNULL))
                with shard.client() as probe:
                    wait_registered(probe, name, TIMEOUT)
            yield registry, shards
        finally:
            codes = [stop(proc) for proc in procs]
            assert codes == [0] * len(procs), f"worker exit codes {codes}"


def test_a_misrouted_request_is_refused_and_forks_once_on_its_own_shard(
        deployment: tuple[EmbeddedServer, list[EmbeddedServer]]) -> None:
    registry_server, shards = deployment
    with registry_server.client() as host, shards[0].client() as q0, shards[1].client() as q1:
        registry = Registry(host)
        registry.append(registry.create("src"), turn(1))
        rid = next(f"misrouted-{i}" for i in range(100) if shard_of(f"misrouted-{i}", 2) == 1)

        misrouted = Client(q0, SETTINGS)  # one server: it takes every id for its own
        with subscribed(q0, keys.DEFAULT_REPLY_CHANNEL) as pubsub:
            refused = misrouted.fork("src", request_id=rid, timeout=TIMEOUT)
            channel, published = next_message(pubsub)
        assert isinstance(refused, ForkFailure), refused
        assert (refused.code, refused.message) == (
            "WRONG_SHARD", f'request id "{rid}" lives on shard 1 of 2, not on shard 0, which this worker serves: '
                           "enqueue it on shard 1's queue server (protocol.shards.shard_of)")
        assert (channel, wire.decode_reply(published)) == (keys.DEFAULT_REPLY_CHANNEL, refused)  # published
        assert [(e.request, e.code) for e in outcome_entries(q0)] == [(rid, "WRONG_SHARD")]  # streamed
        assert misrouted.fork("src", request_id=rid, timeout=TIMEOUT) == refused  # stored: a resend is answered
        assert registry.children("src") == []  # never forked on the wrong shard
        assert q1.exists(keys.request(rid)) == 0  # and nothing of it on its own shard

        routed = Client([q0, q1], SETTINGS)
        first = routed.fork("src", request_id=rid, timeout=TIMEOUT)
        assert isinstance(first, ForkResult) and first.session is not None, first
        assert routed.fork("src", request_id=rid, timeout=TIMEOUT) == first  # a retry: the same child
        assert registry.children("src") == [first.session.id]  # exactly one child
        assert [(e.request, e.code) for e in outcome_entries(q1)] == [(rid, "OK")]
        assert [(e.request, e.code) for e in outcome_entries(q0)] == [(rid, "WRONG_SHARD")]

        # Ids of the served shard are forked there as before.
        own = next(f"own-{i}" for i in range(100) if shard_of(f"own-{i}", 2) == 0)
        assert misrouted.fork("src", request_id=own, timeout=TIMEOUT).ok


def test_a_worker_checks_only_a_sharded_queue(deployment: tuple[EmbeddedServer, list[EmbeddedServer]]) -> None:
    """The service knows its shard from the settings (``SESSIONFORK_SHARD`` of
    ``SESSIONFORK_QUEUE_URLS``); one queue server (one URL listed, or none) has no shard to check."""
    from sessionfork.core.config import Settings
    from sessionfork.worker.service import RequestService

    registry_server, shards = deployment
    urls = tuple(s.url for s in shards)
    with registry_server.client() as host:
        def shard(settings: Settings) -> tuple[int, int] | None:
            return RequestService.from_settings(Registry(host), host, settings).shard

        assert shard(Settings(queue_urls=urls, shard=1)) == (1, 2)
        assert shard(Settings(queue_urls=urls[:1], shard=0)) is None
        assert shard(Settings()) is None
        assert shard(Settings(queue_url=urls[0])) is None

