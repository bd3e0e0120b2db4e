"""What the asyncio client counts as a lost reply (sent again until the deadline)."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from sessionfork.queue.aio import is_lost


def test_a_connection_closed_under_a_write_is_a_lost_reply_and_other_errors_are_not() -> None:
    assert is_lost(RedisConnectionError("Connection closed by server."))
    assert is_lost(AttributeError("'NoneType' object has no attribute 'writelines'"))
    assert not is_lost(AttributeError("'Foo' object has no attribute 'bar'"))
    assert not is_lost(ResponseError("WRONGTYPE"))
