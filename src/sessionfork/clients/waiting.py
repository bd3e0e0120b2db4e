"""The sync side's wait for an outcome: ``ReplyListener`` (a subscription kept across waits, the
sync ``Client``'s) and ``wait_for_reply`` (one wait on a subscription of its own).

The answer is always the stored outcome (``outcomes.verdict``): a message on a reply channel only
wakes the waiter, which then reads the record (anyone may publish on a channel). The stored
outcome is read once the subscription is confirmed (unless the request was enqueued after it was:
its reply is announced to the subscription), after every wake-up, after a reconnection (its
confirmation: replies may have been missed) and every ``recheck_every`` seconds without news, so
a reply is never lost: not one published before the waiter listened, nor one announced on another
channel (an earlier submission of the same request with another ``replyTo``).
"""

from __future__ import annotations

import time
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core import wire
from ..core.connections import retries_until
from ..core.wire import Outcome
from ..protocol.outcomes import addressee, read_outcome

_LOST = (RedisConnectionError, RedisTimeoutError)


class ReplyListener:
    """A pub/sub connection to one queue server that stays subscribed to the reply channels its
    waits used: a wait then costs the server one read of the stored outcome, no SUBSCRIBE or
    UNSUBSCRIBE. One thread's (the sync ``Client`` keeps one per thread and shard); ``close``
    unsubscribes and gives the connection back to its pool.

    Every reply published on a subscribed channel reaches it, between waits too (read and dropped
    at the next wait): schedulers that wait seldom on a busy shared channel can each take a
    ``replyTo`` of their own.
    """

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._pubsub: Any = None
        self._channels: set[str] = set()  # subscriptions the server confirmed on this connection

    def ready(self, channel: str, deadline: float) -> bool:
        """Subscribed to ``channel``, confirmed by the server (now, or by an earlier wait);
        ``False`` at ``deadline``. A reply announced after this returns reaches the listener."""
        with retries_until(deadline):  # no reconnection outlasts the deadline (a failover)
            return self._ready(channel, deadline)

    def _ready(self, channel: str, deadline: float) -> bool:
        if self._pubsub is None:
            self._pubsub = self.redis.pubsub()
        if channel in self._channels:
            return True  # a dropped connection shows at the next read, and is subscribed again
        self._pubsub.subscribe(channel)
        while (left := deadline - time.monotonic()) > 0:
            message = self._pubsub.get_message(timeout=left)
            if message is not None and message["type"] == "subscribe":
                self._channels.add(wire.text(message["channel"]))
                if channel in self._channels:
                    return True
        return False

    def wait(self, request_id: str, channel: str, timeout: float, *, digest: str | None = None, op: str = "fork",
             announced_after_ready: bool = False, recheck_every: float = 1.0) -> Outcome | None:
        """The outcome of ``request_id`` within ``timeout`` seconds, else ``None``.

        ``announced_after_ready``: the request was enqueued (new) after ``ready(channel)`` returned,
        so its outcome is announced to this subscription: no read of the store before a wake-up.
        With ``digest``, a request id already used by a different request answers
        ``IDEMPOTENCY_CONFLICT``.
        """
        deadline = time.monotonic() + timeout
        with retries_until(deadline):  # no reconnection outlasts the deadline (a failover)
            return self._wait(request_id, channel, deadline, (digest, op), announced_after_ready, recheck_every)

    def _wait(self, request_id: str, channel: str, deadline: float, asked: tuple[str | None, str],
              announced_after_ready: bool, recheck_every: float) -> Outcome | None:
        read = not announced_after_ready
        while True:
            try:
                if not self.ready(channel, deadline):
                    return read_outcome(self.redis, request_id, *asked)  # a last look, at the deadline
                if read:
                    found = read_outcome(self.redis, request_id, *asked)
                    if found is not None:
                        return found
                read = True
                if not _woken(self._pubsub, request_id, deadline, recheck_every):
                    return read_outcome(self.redis, request_id, *asked)
            except _LOST:
                self._drop()
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)  # back off before reconnecting; not synchronisation
                read = True  # replies may have been missed meanwhile

    def close(self) -> None:
        """Unsubscribe and give the connection back to its pool (``release``)."""
        pubsub, self._pubsub = self._pubsub, None
        self._channels.clear()
        if pubsub is not None:
            release(pubsub)

    def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        self._channels.clear()
        if pubsub is not None:
            pubsub.close()


def wait_for_reply(redis: Redis, request_id: str, channel: str, timeout: float,
                   *, digest: str | None = None, recheck_every: float = 1.0) -> Outcome | None:
    """Wait up to ``timeout`` seconds for the outcome of ``request_id``; ``None`` on time-out.

    Subscribes to ``channel`` and waits for the server's confirmation, then reads the stored
    outcome, then listens (``ReplyListener.wait``); unsubscribes at the end (``release``).
    """
    listener = ReplyListener(redis)
    try:
        return listener.wait(request_id, channel, timeout, digest=digest, recheck_every=recheck_every)
    finally:
        listener.close()


def release(pubsub: Any, confirm_within: float = 1.0) -> None:
    """End a subscription: unsubscribe and give the connection back to its pool open, once the
    server has confirmed the UNSUBSCRIBE (every message before it drained, so the next user reads
    only its own replies). A new connection per wait costs the server more CPU than the wait itself.
    Unconfirmed (or any connection error): the connection is closed, as ``PubSub.close`` does."""
    conn = pubsub.connection
    try:
        if conn is not None and pubsub.subscribed:
            pubsub.unsubscribe()
            until = time.monotonic() + confirm_within
            while pubsub.subscribed and (left := until - time.monotonic()) > 0:
                pubsub.get_message(timeout=left)
            if not pubsub.subscribed:
                conn.deregister_connect_callback(pubsub.on_connect)
                pubsub.connection = None
                pubsub.connection_pool.release(conn)
    except _LOST:
        pass  # closed below
    finally:
        pubsub.close()


def _woken(pubsub: Any, request_id: str, deadline: float, recheck_every: float) -> bool:
    """Listen until a message names ``request_id``, the subscription is renewed (a reconnection:
    replies may have been missed) or ``recheck_every`` passes quietly (``True``: read the store
    again), or until the deadline passes (``False``)."""
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=min(left, recheck_every))
        if message is None or message["type"] == "subscribe" or addressee(message["data"]) == request_id:
            return True
    return False
