"""Redis ``MONITOR`` as a witness of atomicity: every command the server ran, in the order it ran
them, with the client that sent it.

What MONITOR shows (checked on the bundled Valkey): a script's commands follow its ``EVAL`` /
``EVALSHA`` line, each from client ``lua``, with nothing between (a script runs alone); a
transaction's commands are shown when ``EXEC`` runs them, right before the ``EXEC`` line, with
nothing between either (its ``MULTI`` line comes earlier, when it was sent). So "these writes ran
in one script" and "these commands ran in one transaction" are facts of the order read here, not
of timing: no sleep, no race to win.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from redis import Redis

from sessionfork.embedded import EmbeddedServer

_LINE = re.compile(r"^\d+\.\d+ \[\d+ ([^\]]*)\] (.*)$", re.DOTALL)
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
WRITES = frozenset({"HSET", "HDEL", "HINCRBY", "RPUSH", "LPUSH", "LTRIM", "DEL", "SADD", "SREM", "ZADD", "ZREM",
                    "XADD", "SET", "EXPIRE", "PERSIST", "LREM", "UNLINK"})
"""The writing commands the project's scripts and RQ's bookkeeping send (their key is the first argument)."""


@dataclass(frozen=True, slots=True)
class Command:
    """One command as MONITOR showed it: ``client`` is ``"lua"`` for a command a script ran, else
    the sender's ``host:port``; ``args`` are its words, the command name first."""

    client: str
    args: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.args[0].upper()

    def writes(self, key_names: set[str]) -> bool:
        """Whether this command writes one of ``key_names``."""
        return self.name in WRITES and len(self.args) > 1 and self.args[1] in key_names


def _unescape(arg: str) -> str:
    return arg.replace('\\"', '"').replace("\\\\", "\\")


@contextmanager
def monitored(server: EmbeddedServer, timeout: float = 30.0) -> Iterator[list[Command]]:
    """The commands ``server`` ran while the block ran, in their order (the list is filled in when
    the block ends: the block's end is marked by an ``ECHO`` of a fresh token, read up to it)."""
    watcher = Redis.from_url(server.url, socket_timeout=timeout)
    conn = watcher.connection_pool.get_connection()
    seen: list[Command] = []
    try:
        conn.send_command("MONITOR")
        assert conn.read_response() in (b"OK", "OK")
        yield seen
        marker = f"monitor-end-{uuid.uuid4().hex}"
        with Redis.from_url(server.url) as other:
            other.echo(marker)
        while True:
            line = conn.read_response()
            text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
            found = _LINE.match(text)
            assert found is not None, text
            command = Command(found.group(1), tuple(_unescape(a) for a in _ARG.findall(found.group(2))))
            if command.name == "ECHO" and command.args[1:] == (marker,):
                return
            seen.append(command)
    finally:
        conn.disconnect()
        watcher.connection_pool.release(conn)
        watcher.close()


def script_runs(seen: Sequence[Command]) -> list[tuple[Command, list[Command]]]:
    """Each ``EVAL`` / ``EVALSHA`` of ``seen`` with the commands its script ran (the ``lua`` lines
    right after it)."""
    runs: list[tuple[Command, list[Command]]] = []
    current: list[Command] | None = None
    for command in seen:
        if command.client == "lua":
            assert current is not None, f"a script's command with no script right before it: {command}"
            current.append(command)
        elif command.name in ("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL"):
            current = []
            runs.append((command, current))
        else:
            current = None
    return runs


def transaction_of(seen: Sequence[Command], index: int) -> list[Command] | None:
    """The commands of the ``MULTI``/``EXEC`` transaction that ran ``seen[index]`` (a script's
    line: its ``EVAL``'s), in their order, ``EXEC`` left out; ``None`` when it ran in none.

    A transaction's commands are shown at ``EXEC``, right before it and with nothing between; its
    ``MULTI`` was shown when it arrived, before them. So a command ran in one exactly when, going
    forward from it over its client's (and scripts') lines, that client's ``EXEC`` comes before any
    ``MULTI`` of it or any other client's line."""
    while seen[index].client == "lua":
        index -= 1
    client = seen[index].client
    end = index
    while end < len(seen) and seen[end].client in (client, "lua") and seen[end].name != "EXEC":
        if seen[end].name == "MULTI" and seen[end].client == client:
            return None
        end += 1
    if end == len(seen) or seen[end].client != client:
        return None
    start = index
    while start > 0 and seen[start - 1].client in (client, "lua") and seen[start - 1].name != "MULTI":
        start -= 1
    return list(seen[start:end])
