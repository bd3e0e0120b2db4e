"""The peers' no-op jobs for ``bench.peers``: one function that does nothing, registered as a
Dramatiq actor on its Redis broker and as a task of a ``RedisHuey`` without a result store.

Each app counts the jobs its framework reports done (``Done``): Dramatiq's ``after_ack`` (the
message acknowledged in Redis, so no longer pending), Huey's ``complete`` signal. ``pending`` reads,
from the peer's own keys, how many of a run's jobs are still queued or were dead-lettered.
"""

from __future__ import annotations

import threading
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


class Done:
    """The jobs a framework reported done, and ``reached``, set once there are ``expected``."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.reached = threading.Event()
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.count += 1
            if self.count >= self.expected:
                self.reached.set()


class _Acked(dramatiq.Middleware):
    """Counts the messages Dramatiq acknowledged (the ack sent to Redis and answered)."""

    def __init__(self, done: Done) -> None:
        self.done = done

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        self.done.add()


def dramatiq_app(url: str, done: Done) -> tuple[RedisBroker, Any]:
    """A Redis broker on ``url`` with its default middleware and ``done`` counting acks, and the
    no-op actor on ``QUEUE`` (``.send()`` queues one job)."""
    broker = RedisBroker(url=url, namespace=DRAMATIQ_NAMESPACE)  # type: ignore[no-untyped-call]
    broker.add_middleware(_Acked(done))
    return broker, dramatiq.actor(broker=broker, actor_name="noop", queue_name=QUEUE)(noop)


def huey_app(url: str, done: Done) -> tuple[RedisHuey, Any]:
    """A ``RedisHuey`` on ``url`` storing no results, ``done`` counting completed tasks, and the
    no-op task (calling it queues one job)."""
    huey = RedisHuey(QUEUE, results=False, url=url)

    def completed(signal: str, task: Any, *args: Any) -> None:
        done.add()

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
