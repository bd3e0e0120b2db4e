"""The asyncio client's reply subscription: one pub/sub connection, waiters woken by request id.

``ReplyRouter.expect`` registers a waiter's wake-up event and returns once the subscription to its
reply channel is confirmed by the server, so that a stored outcome read afterwards cannot miss a
reply published in between. A message only wakes the waiters of the request id it names: they
then read the stored outcome (``AsyncClient``); what a message says is never an answer. A channel
is subscribed while some waiter needs it, and its state is dropped once no waiter needs it and
its confirmations are in, so the router holds state only for channels in use.

The subscription has a connection of its own, and only the reader task ever (re)connects it:
when it drops, the reader reconnects and redis-py subscribes again to every channel in use;
meanwhile nothing else is sent on it (a waiter that needs a new channel waits for the reader) and
redis-py's record of the channels to renew stays as it was when the connection dropped (a channel
its last waiter left meanwhile is renewed, then dropped again), and every confirmation wakes the
channel's waiters (a reply may have been published meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..core import wire
from ..core.outages import LOST, is_lost
from ..protocol.outcomes import addressee

log = logging.getLogger("sessionfork.aio")


def cancels() -> int:
    """The current task's pending cancellation requests (``Task.cancelling()``): a call notes it when
    it begins, to tell later whether it was cancelled meanwhile (``honour_cancel``)."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def honour_cancel(since: int) -> None:
    """Raise ``CancelledError`` if the current task was cancelled after its ``cancels()`` was
    ``since`` and is still running: the cancellation was swallowed. On Python 3.11, redis-py's
    ``asyncio.wait_for`` around each socket write returns the write's result when a cancellation
    comes as the write ends; called after a command the caller's own task sends (a waiter's
    SUBSCRIBE, ``aclose``'s), it ends the call there instead (a call's other commands run in a task
    of their own, which the client cancels until it ends: ``aio._cut``)."""
    if cancels() > since:
        raise asyncio.CancelledError


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
    """One pub/sub subscription of a client, waking waiters by request id."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._pool: ConnectionPool | None = None
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one SUBSCRIBE/UNSUBSCRIBE at a time
        self._channels: dict[str, _Channel] = {}
        self._inboxes: dict[str, set[asyncio.Event]] = {}  # wake-ups by request id
        self._strays: set[asyncio.Task[None]] = set()  # drops of subscriptions no waiter needs
        self._up = asyncio.Event()  # the connection is up: others may send on it

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
        confirmed again), once the subscription to ``channel`` is confirmed, or at ``deadline``
        (loop time) if it is not confirmed by then: the caller then has only a last read of the
        stored outcome left, which needs no subscription. Leaving it unsubscribes (when no other
        waiter needs the channel) outside any deadline of the caller's.
        """
        woken = asyncio.Event()
        self._inboxes.setdefault(request_id, set()).add(woken)
        state = self._channels.setdefault(channel, _Channel())
        state.boxes.add(woken)
        loop, since = asyncio.get_running_loop(), cancels()
        try:
            # Bounded as a whole: the lock too (another waiter may hold it while the reader reconnects).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(max(deadline, loop.time())):
                    if not state.subscribed:
                        async with self._lock:
                            if not state.subscribed:
                                await self._subscribe(channel, state)
                                honour_cancel(since)  # the SUBSCRIBE's write may swallow it
                    await state.ready.wait()
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
                self._leave(channel, state)

    async def _subscribe(self, channel: str, state: _Channel) -> None:
        """Subscribe to ``channel`` (the caller holds the lock and bounds the wait)."""
        if self._pubsub is None:
            await self._open()
        # Up, or the reader is reconnecting: wait for it (it alone connects).
        await self._up.wait()
        state.ready.clear()
        state.subscribed = True
        state.sent += 1  # before the send: the reader may see the confirmation before it returns
        # In redis-py's record first: if the connection drops, the reader's reconnection renews it.
        self._pubsub.channels[self._key(channel)] = None
        await self._send("SUBSCRIBE", channel)

    async def _open(self) -> None:
        """The subscription's own connection (never more than one), and its reader; tried until it
        connects, a connection error that is not a lost one, or the caller's cancellation (which
        closes what was opened)."""
        base = self._redis.connection_pool
        # No retry inside redis-py: a reconnection there could run in a waiter's task while the
        # reader reads the same connection. The reader reconnects (``_read``).
        kwargs = {**base.connection_kwargs, "retry": Retry(NoBackoff(), 0, supported_errors=()),
                  "retry_on_error": []}
        pool = ConnectionPool(connection_class=base.connection_class, max_connections=1, **kwargs)
        pubsub = Redis(connection_pool=pool).pubsub()
        retry_in = 0.05
        try:
            while True:
                try:
                    await pubsub.connect()  # type: ignore[no-untyped-call]
                    break
                except Exception as exc:
                    if not is_lost(exc):
                        raise
                    await asyncio.sleep(retry_in)  # back-off, not synchronisation
                    retry_in = min(retry_in * 2, 1.0)
        except BaseException:
            await asyncio.shield(pool.disconnect())
            raise
        self._pool, self._pubsub = pool, pubsub
        self._up.set()
        self._reader = asyncio.create_task(self._read(), name="sessionfork-replies")

    def _key(self, channel: str) -> Any:
        """A channel as redis-py keys its record of subscriptions (``PubSub.channels``)."""
        encoder = self._pubsub.encoder
        return encoder.decode(encoder.encode(channel))

    async def _send(self, command: str, channel: str) -> None:
        """``command channel`` on the live connection; nothing while the reader reconnects (its
        reconnection subscribes again to what ``PubSub.channels`` holds)."""
        conn = self._pubsub.connection
        if not self._up.is_set() or conn is None or not conn.is_connected:
            return
        try:
            await conn.send_command(command, channel, check_health=False)
        except Exception as exc:
            if not is_lost(exc):
                raise
            # The connection is gone (closed by redis-py, or by the reader under this write): the
            # reader reconnects and renews.
            log.warning("could not send %s %s: %s", command, channel, exc)

    def _forget(self, channel: str, state: _Channel) -> None:
        """Drop the state of a channel no waiter needs (unless a new one took its place)."""
        if not state.needed and self._channels.get(channel) is state:
            del self._channels[channel]

    def _leave(self, channel: str, state: _Channel) -> None:
        """The last waiter of ``channel`` left: it is unsubscribed at once, with no lock and no wait
        (the call returns now, whoever holds the lock and for how long); the UNSUBSCRIBE goes out
        from a task of its own (``_drop``), unless a new waiter has subscribed by then."""
        if not state.boxes and state.subscribed and self._pubsub is not None:
            state.subscribed = False
            state.ready.clear()
            if self._up.is_set():
                self._pubsub.channels.pop(self._key(channel), None)
                self._drop_later(channel)
            # Else the reconnection renews it as counted when it dropped; that confirmation drops
            # it again (``_route``). Taking it out of redis-py's record now would leave the count
            # waiting for a confirmation that never comes.
        self._forget(channel, state)

    def _drop_later(self, channel: str) -> None:
        task = asyncio.get_running_loop().create_task(self._drop(channel))
        self._strays.add(task)
        task.add_done_callback(self._strays.discard)

    async def _drop(self, channel: str) -> None:
        """Unsubscribe from a subscription that no waiter needs any more (left, or renewed after its
        last waiter left), unless a waiter has subscribed to it again meanwhile."""
        async with self._lock:
            state = self._channels.get(channel)
            if (state is None or not (state.boxes or state.subscribed)) and self._pubsub is not None \
                    and self._up.is_set():
                self._pubsub.channels.pop(self._key(channel), None)  # not renewed by a reconnection
                await self._send("UNSUBSCRIBE", channel)

    async def _read(self) -> None:
        delay = 0.05
        while True:
            honour_cancel(0)  # aclose's cancellation, if a write of redis-py's swallowed it
            try:
                if not self._up.is_set():
                    # Connecting runs redis-py's renewal: SUBSCRIBE to every channel in use.
                    await self._pubsub.connect()
                    self._up.set()
                message = await self._pubsub.get_message(timeout=None)
            except Exception as exc:
                if not is_lost(exc):
                    raise
                log.warning("reply subscription lost (%s); reconnecting in %.2fs", exc, delay)
                self._up.clear()
                with contextlib.suppress(*LOST):
                    if self._pubsub.connection is not None:
                        await self._pubsub.connection.disconnect()
                for name, state in list(self._channels.items()):
                    # Expect one confirmation of each subscription the reconnection renews (what
                    # redis-py's record holds: nothing changes it until the connection is up);
                    # until it comes, a new waiter waits for it before it reads the stored outcome.
                    renewed = self._key(name) in self._pubsub.channels
                    state.confirmed = state.sent - 1 if renewed else state.sent
                    state.ready.clear()
                    self._forget(name, state)
                await asyncio.sleep(delay)  # back-off, not synchronisation
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.05
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
                # Renewed by a reconnection after the last waiter left, or confirmed after its
                # UNSUBSCRIBE was lost: drop it again.
                self._drop_later(name)
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
        for task in list(self._strays):
            task.cancel()
        if self._pubsub is not None:
            await self._pubsub.aclose()
            self._pubsub = None
        if self._pool is not None:
            await self._pool.disconnect()
            self._pool = None
        self._up.clear()
        self._channels.clear()
