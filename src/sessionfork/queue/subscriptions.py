"""The asyncio client's reply subscription: one pub/sub connection, waiters woken by request id.

``ReplyRouter.expect`` registers a waiter's wake-up event and returns once the subscription to its
reply channel is confirmed by the server, so that a stored outcome read afterwards cannot miss a
reply published in between. A message only wakes the waiters of the request id it names: they
then read the stored outcome (``AsyncClient``); what a message says is never an answer. A channel
is subscribed while some waiter needs it, and its state is dropped once no waiter needs it and
its confirmations are in, so the router holds state only for channels in use. When the connection
drops, redis-py subscribes again as it reconnects; until the server confirms it, new waiters wait,
and the confirmation wakes the channel's waiters (a reply may have been published meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core import wire
from .outcomes import addressee

log = logging.getLogger("sessionfork.aio")


@dataclass
class _Channel:
    """A reply channel of the subscription: its waiters, SUBSCRIBEs sent and confirmed (counted
    since the start: confirmations come in command order, so ``confirmed == sent`` means the
    latest SUBSCRIBE took effect)."""

    boxes: set[asyncio.Event] = field(default_factory=set)  # the wake-ups of its waiters
    subscribed: bool = False
    sent: int = 0
    confirmed: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def needed(self) -> bool:
        """Some waiter listens on it, or a SUBSCRIBE of it is not confirmed yet (a later one must
        not count that confirmation as its own)."""
        return bool(self.boxes) or self.subscribed or self.confirmed < self.sent


class ReplyRouter:
    """One pub/sub subscription of a client, routing replies to waiters by request id."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one SUBSCRIBE/UNSUBSCRIBE at a time
        self._channels: dict[str, _Channel] = {}
        self._inboxes: dict[str, set[asyncio.Event]] = {}  # wake-ups by request id
        self._strays: set[asyncio.Task[None]] = set()  # drops of subscriptions no waiter needs
        self._down = False  # the reader lost the connection and has not read from a new one yet

    @property
    def waiters(self) -> int:
        """Waiters registered now (0 once every wait has returned, timed out or been cancelled)."""
        return sum(len(boxes) for boxes in self._inboxes.values())

    @property
    def channels(self) -> list[str]:
        """Channels the client is subscribed to now (those some waiter listens on)."""
        return sorted(name for name, ch in self._channels.items() if ch.subscribed)

    @property
    def tracked(self) -> int:
        """Channels the router holds state for (bounded by those in use, not by all ever used)."""
        return len(self._channels)

    @contextlib.asynccontextmanager
    async def expect(self, request_id: str, channel: str, deadline: float) -> AsyncIterator[asyncio.Event]:
        """A wake-up for ``request_id`` (set when a message names it, or when the subscription is
        renewed), once the subscription to ``channel`` is confirmed.

        ``TimeoutError`` when the confirmation does not come before ``deadline`` (loop time).
        """
        woken = asyncio.Event()
        self._inboxes.setdefault(request_id, set()).add(woken)
        state = self._channels.setdefault(channel, _Channel())
        state.boxes.add(woken)
        try:
            if not state.subscribed:
                async with self._lock:
                    if not state.subscribed:
                        await self._subscribe(channel, state)
            left = deadline - asyncio.get_running_loop().time()
            await asyncio.wait_for(state.ready.wait(), max(left, 0))
            woken.clear()  # the waiter reads the stored outcome first: wake-ups before it are moot
            yield woken
        finally:
            boxes = self._inboxes.get(request_id)
            if boxes is not None:
                boxes.discard(woken)
                if not boxes:
                    del self._inboxes[request_id]
            state.boxes.discard(woken)
            if not state.boxes:
                # Shielded: a waiter cancelled again while it leaves still drops the subscription.
                await asyncio.shield(self._unsubscribe(channel, state))

    async def _subscribe(self, channel: str, state: _Channel) -> None:
        if self._pubsub is None:
            self._pubsub = self._redis.pubsub()
        state.ready.clear()
        state.subscribed = True
        state.sent += 1  # before the await: the reader may see the confirmation before it returns
        try:
            await self._pubsub.subscribe(channel)
        except BaseException:
            state.subscribed = False
            state.sent -= 1
            raise
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name="sessionfork-replies")

    def _forget(self, channel: str, state: _Channel) -> None:
        """Drop the state of a channel no waiter needs (unless a new one took its place)."""
        if not state.needed and self._channels.get(channel) is state:
            del self._channels[channel]

    async def _unsubscribe(self, channel: str, state: _Channel) -> None:
        async with self._lock:
            try:
                await self._unsubscribe_locked(channel, state)
            finally:
                self._forget(channel, state)

    async def _unsubscribe_locked(self, channel: str, state: _Channel) -> None:
        if state.boxes or not state.subscribed or self._pubsub is None:
            return
        state.subscribed = False
        state.ready.clear()
        if self._down:
            # The reader is reconnecting: two tasks must not reconnect one pub/sub connection
            # at once. redis-py renews this subscription as it reconnects, and the renewal's
            # confirmation drops it (``_route``).
            return
        try:
            await self._pubsub.unsubscribe(channel)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            # The waiter has its answer (or its error) already; a stray subscription only
            # brings messages that no waiter takes.
            log.warning("could not unsubscribe from %s: %s", channel, exc)

    async def _drop(self, channel: str) -> None:
        """Unsubscribe from a subscription redis-py renewed that no waiter needs."""
        async with self._lock:
            state = self._channels.get(channel)
            if (state is not None and (state.boxes or state.subscribed)) or self._pubsub is None or self._down:
                return
            try:
                await self._pubsub.unsubscribe(channel)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("could not unsubscribe from %s: %s", channel, exc)

    async def _read(self) -> None:
        delay = 0.05
        while True:
            try:
                message = await self._pubsub.get_message(timeout=None)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                # redis-py reconnects and subscribes again on the next read; waiters re-read the
                # stored outcomes within ``recheck_every``, so nothing published meanwhile is lost.
                log.warning("reply subscription lost (%s); reconnecting in %.2fs", exc, delay)
                self._down = True
                for name, state in list(self._channels.items()):
                    # Expect one confirmation of the subscription redis-py renews; until it comes,
                    # a new waiter waits for it before it reads the stored outcome.
                    state.confirmed = state.sent - 1 if state.subscribed else state.sent
                    state.ready.clear()
                    self._forget(name, state)
                await asyncio.sleep(delay)  # back-off, not synchronisation
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.05
            self._down = False
            if message is not None:
                try:
                    self._route(message)
                except Exception:  # a bad message must not stop the routing of the others
                    log.exception("could not route a message on the reply subscription")

    def _route(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        name = wire.text(message["channel"]) if message.get("channel") is not None else ""
        if kind == "subscribe":
            state = self._channels.get(name)
            if state is not None:
                state.confirmed += 1
                if state.subscribed and state.confirmed >= state.sent:
                    state.ready.set()
                for woken in state.boxes:  # (re)subscribed: a reply may have come meanwhile
                    woken.set()
                self._forget(name, state)
            if state is None or not (state.boxes or state.subscribed):
                # redis-py renewed it on reconnecting after the last waiter left (its
                # UNSUBSCRIBE failed on the dead connection, or was never sent): drop it again.
                task = asyncio.get_running_loop().create_task(self._drop(name))
                self._strays.add(task)
                task.add_done_callback(self._strays.discard)
            return
        if kind != "message":
            return
        request_id = addressee(message["data"])
        if request_id is not None:
            for woken in self._inboxes.get(request_id, ()):
                woken.set()

    async def aclose(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._pubsub is not None:
            await self._pubsub.aclose()
            self._pubsub = None
        self._channels.clear()
