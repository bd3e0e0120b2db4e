"""``CommandPacker`` (the sync clients' ``command_packer``) sends the bytes redis-py's own packer
sends, raises the errors it raises, and is what ``connections`` builds its clients with."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis
from redis._parsers.encoders import Encoder  # redis-py's encoder (redis.connection uses it, unexported)
from redis.connection import HiredisRespSerializer, PythonRespSerializer
from redis.exceptions import DataError

from sessionfork.core import connections
from sessionfork.core.config import Settings
from sessionfork.core.packer import CommandPacker
from sessionfork.embedded import EmbeddedServer

_ENCODE = Encoder("utf-8", "strict", False).encode
REDIS_PY = HiredisRespSerializer(PythonRespSerializer(6000, _ENCODE).pack, _ENCODE)
"""redis-py's own packer, as a connection with hiredis and the default encoding builds it."""

COMMANDS: list[tuple[Any, ...]] = [
    ("SET", "key", "value"),
    ("EVALSHA", "f" * 40, 3, "sf:s:{a}", "sf:s:{a}:log", b"raw\x00\xff", 0, -1, 2**70, -(2**64)),
    ("HSET", "k", "é", "日本語", "emoji 🎉", ""),
    ("ZADD", "z", 0.1, "a", 1e20, "b", -0.0, "c", float("inf"), "d", float("-inf"), "e", 1.5e-300, "f"),
    ("SET", "big", "x" * 10_000),  # past redis-py's buffer cutoff
    ("SET", b"big", b"y" * 10_000),
    ("SET", "mv", memoryview(b"view")),
    ("SET", "ba", bytearray(b"array")),  # hiredis takes no bytearray: redis-py packs it
    ("CLIENT SETNAME", "me"),  # a name with a space: split by redis-py
    ("CONFIG GET", "maxmemory"),
    (b"GET", "k"),
    (b"SCRIPT LOAD", "return 1"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=[str(c[0]) + str(i) for i, c in enumerate(COMMANDS)])
def test_the_bytes_are_redis_pys(command: tuple[Any, ...]) -> None:
    assert b"".join(CommandPacker().pack(*command)) == b"".join(REDIS_PY.pack(*command))


@pytest.mark.parametrize("value", [True, False, None, [1], {"a": 1}, object()])
def test_a_value_redis_py_refuses_is_its_data_error(value: object) -> None:
    with pytest.raises(DataError) as ours:
        CommandPacker().pack("SET", "k", value)
    with pytest.raises(DataError) as theirs:
        REDIS_PY.pack("SET", "k", value)
    assert str(ours.value) == str(theirs.value)


def test_a_string_that_is_not_utf_8_is_refused_as_redis_py_refuses_it() -> None:
    with pytest.raises(UnicodeEncodeError):
        CommandPacker().pack("SET", "k", "\udcff")
    with pytest.raises(UnicodeEncodeError):
        REDIS_PY.pack("SET", "k", "\udcff")


def test_the_clients_connections_builds_pack_with_it_and_round_trip_every_kind_of_value(
        server: EmbeddedServer) -> None:
    client = connections.queue_client(Settings(), server.url)
    try:
        packer = client.connection_pool.connection_kwargs.get("command_packer")
        assert isinstance(packer, CommandPacker)
        client.flushall()
        client.client_setname("packed")  # a command name with a space
        assert client.client_getname() == "packed"
        client.hset("h", mapping={"s": "é🎉", "b": b"\x00\xff", "i": -(2**63), "f": 0.1})
        assert client.hgetall("h") == {b"s": "é🎉".encode(), b"b": b"\x00\xff", b"i": b"-9223372036854775808",
                                       b"f": b"0.1"}
        assert client.eval("return {ARGV[1], ARGV[2]}", 1, "h", "x" * 10_000, 7) == [b"x" * 10_000, b"7"]
        with pytest.raises(DataError):
            client.set("k", True)  # type: ignore[arg-type]
    finally:
        client.close()


def test_a_registry_client_is_built_with_it(server: EmbeddedServer) -> None:
    client = connections.registry_client(Settings(), server.url)
    try:
        assert isinstance(client, Redis)
        assert isinstance(client.connection_pool.connection_kwargs.get("command_packer"), CommandPacker)
    finally:
        client.close()
