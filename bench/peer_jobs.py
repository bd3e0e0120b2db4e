"""The peers' no-op jobs for ``bench.peers``: one function that does nothing, registered as a
Dramatiq actor on its Redis broker and as a task of a ``RedisHuey`` without a result store.

Each app calls ``on_done`` for every job its framework reports done: Dramatiq's ``after_ack`` (the
message acknowledged in Redis, so no longer pending), Huey's ``complete`` signal. ``pending`` reads,
from the peer's own keys, how many of a run's jobs are still queued or were dead-lettered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from huey import RedisHuey
from huey.signals import SIGNAL_COMPLETE
from redis import Redis

QUEUE = "peer"
"""The queue (Dramatiq) and the app name (Huey) of the no-op jobs."""
DRAMATIQ_NAMESPACE = "dramatiq"  # RedisBroker's default: its keys are <namespace>:<queue>...


def noop() -> None:
    """The peers' job: nothing at all."""


class _Acked(dramatiq.Middleware):
    """Calls ``on_done`` for each message Dramatiq acknowledged (the ack sent to Redis and answered)."""

    def __init__(self, on_done: Callable[[], None]) -> None:
        self.on_done = on_done

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        self.on_done()


def dramatiq_app(url: str, on_done: Callable[[], None]) -> tuple[RedisBroker, Any]:
    """A Redis broker on ``url`` with its default middleware and ``on_done`` called at each ack, and
    the no-op actor on ``QUEUE`` (``.send()`` queues one job)."""
    broker = RedisBroker(url=url, namespace=DRAMATIQ_NAMESPACE)  # type: ignore[no-untyped-call]
    broker.add_middleware(_Acked(on_done))
    return broker, dramatiq.actor(broker=broker, actor_name="noop", queue_name=QUEUE)(noop)


def huey_app(url: str, on_done: Callable[[], None]) -> tuple[RedisHuey, Any]:
    """A ``RedisHuey`` on ``url`` storing no results, ``on_done`` called for each completed task,
    and the no-op task (calling it queues one job)."""
    huey = RedisHuey(QUEUE, results=False, url=url)

    def completed(signal: str, task: Any, *args: Any) -> None:
        on_done()

    huey.signal(SIGNAL_COMPLETE)(completed)
    return huey, huey.task(name="noop")(noop)


def pending(system: str, redis: Redis) -> int:
    """Jobs of a drained ``system`` (``dramatiq`` or ``huey``) not done: a Dramatiq message not
    acknowledged (its body stays in the queue's ``.msgs`` hash until then) or dead-lettered, a Huey
    task still in its queue list."""
    if system == "dramatiq":
        queue = f"{DRAMATIQ_NAMESPACE}:{QUEUE}"
        return int(redis.hlen(f"{queue}.msgs")) + int(redis.zcard(f"{queue}.XQ"))
    if system == "huey":
        return int(RedisHuey(QUEUE, results=False, connection_pool=redis.connection_pool).pending_count())
    raise ValueError(f"no pending count for {system!r}")
