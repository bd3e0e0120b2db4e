"""``CommandPacker``: how the sync clients (``connections``) turn a command into the bytes sent.

redis-py's own packer with hiredis (``redis.connection.HiredisRespSerializer``) encodes each
argument in Python first (``Encoder.encode``: five ``isinstance`` checks and a method call per
argument), then hands the tuple to ``hiredis.pack_command``, which takes ``str`` (as UTF-8),
``bytes``, ``int`` and ``float`` itself, in C. A fork's commands carry some 65 arguments, a
fan-out's about 5 per child: that Python encode was a fifth of a worker's CPU per fork.

``CommandPacker`` hands the arguments to ``hiredis.pack_command`` as they are, and everything
else to redis-py's own packer, so the bytes and the errors are redis-py's (a test compares them):
a command name with a space in it (``"CLIENT SETNAME"``, split there), and any argument hiredis
does not take (a ``bool`` or ``None``: redis-py's ``DataError``; a ``bytearray``). Strings are
UTF-8, strict, as redis-py's default encoder writes them (the clients set no other encoding).

It is redis-py's ``command_packer`` connection argument (``AbstractConnection``), an object with
``pack(*args) -> list[bytes]``; ``RedisCluster`` does not pass it on (its nodes keep redis-py's
own), nor do the asyncio clients.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis._parsers.encoders import Encoder  # redis-py's encoder (redis.connection uses it, unexported)
from redis.connection import HiredisRespSerializer, PythonRespSerializer

_BUFFER_CUTOFF = 6000  # redis-py's: arguments longer than this are sent as buffers of their own


class CommandPacker:
    """``pack(*args)``: the command's bytes, by hiredis alone when it takes the arguments as they
    are, else by redis-py's own packer (see the module docstring). Stateless: one serves every
    connection of a client."""

    def __init__(self) -> None:
        encode = Encoder("utf-8", "strict", False).encode  # type: ignore[no-untyped-call]  # redis-py's, untyped
        self._redis_py = HiredisRespSerializer(  # type: ignore[no-untyped-call]
            PythonRespSerializer(_BUFFER_CUTOFF, encode).pack, encode)

    def pack(self, *args: Any) -> list[bytes]:
        name = args[0]
        if isinstance(name, str) and " " not in name:
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass  # an argument hiredis does not take: redis-py's packer (or its DataError)
        return self._redis_py.pack(*args)  # type: ignore[no-any-return]
