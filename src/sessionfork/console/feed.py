"""The live views' one reader: a thread that follows every shard's outcome stream and hands each
new row to every open live view, however many are open.

A live view is a ``Subscription``: a bounded queue on the app's event loop, no thread of its own.
The reader runs while at least one view is open (started by the first, ended after the last) and
is the only code that blocks on Redis for them: a hung server holds that one thread, never the
threads the pages are served from, and a thousand open views cost a thousand queues. A view is
told ``ready`` once the reader stands where every outcome stored from then on will reach it; while
a read fails, each view is told once (``fault``) and again when the reads answer (``restored``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from redis.exceptions import RedisError

from . import reads

Message = tuple[str, Any]
"""What a view is handed: ``("ready", None)`` once every outcome stored from then on will come to
it, then ``("outcome", Row)``, ``("fault", text)`` or ``("restored", None)``."""

QUEUED = 1000
"""The messages a view may have waiting; a view that falls further behind loses the oldest."""

BACK_OFF = 1.0
"""Seconds between two reads while the servers fail."""


@dataclass(eq=False)
class Subscription:
    """One open live view: what it keeps (its filter) and its queue of messages."""

    keep: reads.Filter
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Message] = field(default_factory=lambda: asyncio.Queue(QUEUED))
    ready: bool = False
    """Handed ``ready``: every outcome stored from then on comes to this view."""

    def offer(self, message: Message) -> None:
        """Queue ``message`` (on the view's loop); a full queue drops its oldest first."""
        if self.queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
        self.queue.put_nowait(message)


class Feed:
    """Every shard's new outcomes, read once, for up to ``limit`` open views.

    ``read`` runs a read of the servers within the console's bound; ``block_ms`` is how long one
    read of the streams may block waiting for a new entry."""

    def __init__(self, shards: Sequence[Any], read: Callable[[Callable[[], Any]], Any], *, limit: int,
                 block_ms: int) -> None:
        self.shards = shards
        self.read = read
        self.limit = limit
        self.block_ms = block_ms
        self.fault: str | None = None
        self._views: set[Subscription] = set()
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    @property
    def open(self) -> int:
        """How many views are open."""
        return len(self._views)

    def join(self, keep: reads.Filter) -> Subscription | None:
        """A new view of the rows ``keep`` keeps, from now on (``None``: ``limit`` views are open).
        Called on the app's event loop."""
        view = Subscription(keep=keep, loop=asyncio.get_running_loop())
        with self._lock:
            if len(self._views) >= self.limit:
                return None
            self._views.add(view)
            if self.fault is not None:
                view.offer(("fault", self.fault))
            if self._reader is None:
                self._reader = threading.Thread(target=self._follow, name="console-feed", daemon=True)
                self._reader.start()
        return view

    def leave(self, view: Subscription) -> None:
        """Close ``view`` (the reader ends once no view is open)."""
        with self._lock:
            self._views.discard(view)

    def _follow(self) -> None:
        last: list[str] | None = None
        while True:
            with self._lock:
                if not self._views:
                    self._reader, self.fault = None, None
                    return
            try:
                if last is None:  # where the streams stand: every view is handed what comes after
                    last = self.read(lambda: reads.newest_ids(self.shards))
                    rows: list[reads.Row] = []
                else:
                    rows = self.read(partial(reads.following, self.shards, last, self.block_ms))
            except (RedisError, TimeoutError) as exc:
                text = f"Redis unreachable or failing: {type(exc).__name__}"
                if self.fault is None:
                    self.fault = text
                    self._hand(self._open(), None, ("fault", text))
                time.sleep(BACK_OFF)  # the servers are away: read again shortly
                continue
            views = self._open()  # after the read: a view that joined while it blocked gets its rows
            if self.fault is not None:
                self.fault = None
                self._hand(views, None, ("restored", None))
            fresh = [view for view in views if not view.ready]
            for view in fresh:
                view.ready = True
            self._hand(fresh, None, ("ready", None))
            for row in rows:
                self._hand(views, row, ("outcome", row))

    def _open(self) -> list[Subscription]:
        with self._lock:
            return list(self._views)

    @staticmethod
    def _hand(views: list[Subscription], row: reads.Row | None, message: Message) -> None:
        for view in views:
            if row is None or view.keep.keeps(row):
                with contextlib.suppress(RuntimeError):  # its loop closed: the app is stopping
                    view.loop.call_soon_threadsafe(view.offer, message)
