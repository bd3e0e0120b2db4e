"""``CallStream``: script calls sent to one server as they are built, their replies read after.

A pipeline sends its commands once the last is built, and the caller then waits while the server
runs them all: the caller's work and the server's take turns. A stream sends each group of calls
(``send``) as soon as the caller has built it, on a connection of its own, and reads a group's
replies (``replies``) when the caller needs them: the server runs the first groups while the
caller builds the next, and the caller reads a group's replies while the server runs the later
ones. A batch's child steps go this way (``forks.send_many``): one fork's calls are built while
the server creates the previous fork's children.

What a caller gets is ``lua.run``'s: each group's results in order, a call that met NOSCRIPT run
again once its script is loaded (after the calls sent behind it, as in a pipeline), an error reply
raised. The calls must be idempotent, as a pipeline's are when redis-py re-sends it: when the
connection drops, the calls with no reply read yet run again, in one pipeline with the client's
retries (a child step finds the child it created and answers it), when the client sends a command
again after a dropped connection; a client that does not (``connections.queue_client``'s
``resend``: the worker's) gets the connection error, so that its caller runs the whole step again
(the calls answered already may be lost on the server the URL names now: a promoted replica). A time-out is raised (the
server is frozen: the caller's step is retried as a whole, as a pipeline's time-out is), and the
connection is dropped, never handed back to the pool with replies unread.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from . import lua

Ticket = tuple[int, int]
"""A ``send``'s calls: their first and past-last positions in the stream."""


class CallStream:
    """Calls to one server (``redis``: a ``Redis``, not a cluster), sent by ``send`` and answered
    by ``replies``; a context manager that gives the connection back (see the module docstring)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._conn: Any = None
        self._calls: list[lua.Call] = []  # every call sent (or, after a drop, queued), in order
        self._raw: list[Any] = []  # the replies read so far, in the calls' order
        self._dropped = False  # the connection failed: the calls without a reply run in a pipeline

    def send(self, calls: Sequence[lua.Call]) -> Ticket:
        """Send ``calls`` now (``EVALSHA`` each); their ``Ticket`` for ``replies``."""
        first = len(self._calls)
        answered = len(self._raw) == first  # no reply outstanding on the connection
        self._calls.extend(calls)
        if calls and not self._dropped:
            try:
                if self._conn is None:
                    self._conn = self.redis.connection_pool.get_connection()
                conn = self._conn
                # A health check (PING) reads a reply: only when none is outstanding, else it would
                # read an earlier call's (as redis-py's pub/sub checks only an idle connection).
                conn.send_packed_command(conn.pack_commands(
                    [("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls]),
                    check_health=answered)
            except RedisConnectionError:
                self._drop()
            except BaseException:
                self._drop()
                raise
        return first, len(self._calls)

    def replies(self, ticket: Ticket) -> list[Any]:
        """The results of ``ticket``'s calls (``lua.run``'s; see the module docstring), reading the
        replies of the calls sent before them first."""
        first, end = ticket
        while len(self._raw) < end:
            if self._dropped:
                if not self._resends():  # every later call's reply is lost too: each raises
                    raise RedisConnectionError("the connection dropped with calls unanswered")
                self._rerun()
                continue
            try:
                self._raw.append(self._conn.read_response())
            except ResponseError as error:  # an error reply: the call's result (NOSCRIPT: run again)
                self._raw.append(error)
            except RedisConnectionError:
                self._drop()
            except BaseException:
                self._drop()
                raise
        return lua.settle(self.redis, self._calls[first:end], self._raw[first:end])

    def _resends(self) -> bool:
        """Whether the client sends a command again after a dropped connection (its retries)."""
        retry = self.redis.get_retry()
        return retry is None or retry.get_retries() > 0  # None: the connections' own default, which retries

    def _rerun(self) -> None:
        """Every call without a reply read, in one pipeline (redis-py's retries on a dropped
        connection): their replies, in order. The calls sent after go on a new connection."""
        pipe = self.redis.pipeline(transaction=False)
        lua.add(pipe, self._calls[len(self._raw):])
        self._raw.extend(pipe.execute(raise_on_error=False))
        self._dropped = False

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._dropped = True
        if conn is not None:
            conn.disconnect()  # its unread replies go with it
            self.redis.connection_pool.release(conn)

    def close(self) -> None:
        """Give the connection back to the pool: as it is when every reply was read, else dropped."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if len(self._raw) < len(self._calls):
            conn.disconnect()
        self.redis.connection_pool.release(conn)

    def __enter__(self) -> CallStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
