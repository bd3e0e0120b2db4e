"""What the asyncio client counts as a lost reply (sent again until the deadline), and the reply
subscription's SUBSCRIBE on a connection closed under it (the reader renews it)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from sessionfork.clients.aio import _again
from sessionfork.clients.subscriptions import ReplyRouter
from sessionfork.core.outages import is_lost

CLOSED_UNDER_A_WRITE = "'NoneType' object has no attribute 'writelines'"


def test_a_connection_closed_under_a_write_is_a_lost_reply_and_other_errors_are_not() -> None:
    assert is_lost(RedisConnectionError("Connection closed by server."))
    assert is_lost(AttributeError(CLOSED_UNDER_A_WRITE))
    assert not is_lost(AttributeError("'Foo' object has no attribute 'bar'"))
    assert not is_lost(ResponseError("WRONGTYPE"))


class _Closing:
    """A subscription connection that the reader closes under a waiter's write (redis-py's
    asyncio connection then writes to a writer it has set to None)."""

    is_connected = True

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.sent: list[tuple[Any, ...]] = []

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        self.sent.append(args)
        raise self.error


def _send_on(conn: _Closing) -> None:
    async def main() -> None:
        router = ReplyRouter(Redis())
        router._pubsub = SimpleNamespace(connection=conn)
        router._up.set()
        await router._send("SUBSCRIBE", "sf:replies")

    asyncio.run(main())


def test_a_subscribe_on_a_connection_closed_under_it_is_left_to_the_reader() -> None:
    """Found by CI (test_every_fork_gets_its_outcome_while_its_connections_are_killed): the
    AttributeError reached ``AsyncClient.fork``. It is a lost send: the reader's reconnection
    subscribes again to every channel in redis-py's record."""
    conn = _Closing(AttributeError(CLOSED_UNDER_A_WRITE))
    try:
        _send_on(conn)
        error = None
    except Exception as exc:  # the promise is that nothing reaches the call: asserted below
        error = exc
    assert error is None, f"the lost send failed the call: {error!r}"
    assert conn.sent == [("SUBSCRIBE", "sf:replies")]


def test_any_other_error_of_a_subscribe_is_raised() -> None:
    with pytest.raises(AttributeError, match="'Foo'"):
        _send_on(_Closing(AttributeError("'Foo' object has no attribute 'bar'")))


def test_a_command_whose_reply_was_lost_is_sent_again_until_it_answers() -> None:
    """``_again``: a lost reply (the connection killed under the command) is sent again after a
    back-off; the caller gets the answer of the attempt that got through."""
    attempts: list[int] = []

    async def send() -> str:
        attempts.append(len(attempts))
        if len(attempts) < 3:
            raise RedisConnectionError("Connection closed by server.") if attempts[-1] else \
                AttributeError(CLOSED_UNDER_A_WRITE)
        return "answered"

    async def main() -> str:
        return await _again(send, asyncio.get_running_loop().time() + 10)

    assert asyncio.run(main()) == "answered" and attempts == [0, 1, 2]


def test_any_other_error_of_a_command_is_raised_at_once() -> None:
    async def send() -> str:
        raise ResponseError("WRONGTYPE")

    async def main() -> str:
        return await _again(send, asyncio.get_running_loop().time() + 10)

    with pytest.raises(ResponseError):
        asyncio.run(main())
