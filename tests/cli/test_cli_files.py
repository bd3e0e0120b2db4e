"""The JSON files of ``fork``, ``merge`` and ``select`` (``--edits``, ``--variants``, ``--summary``):
a file that is not UTF-8 is the one-line usage error docs/cli.md promises (status 2, the option
named), never a traceback, and nothing is enqueued."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import clean_environ, cli_args
from redis import Redis

from sessionfork.embedded import EmbeddedServer

NOT_UTF8 = b'[{"type": "user/message", "data": "caf\xe9"}]'
"""JSON whose string holds a Latin-1 byte: valid JSON bytes, not UTF-8."""


@pytest.mark.parametrize(("command", "option"), [
    (["fork", "src"], "--edits"),
    (["fork", "src"], "--variants"),
    (["fork", "src"], "--summary"),
    (["merge", "p", "c", "--mode", "summary"], "--summary"),
    (["select", "p", "a", "b", "--mode", "summary"], "--summary"),
], ids=lambda v: v if isinstance(v, str) else v[0])
def test_a_file_that_is_not_utf8_is_a_usage_error_naming_the_option(
        server: EmbeddedServer, redis: Redis, tmp_path: Path, command: list[str], option: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(NOT_UTF8)
    done = subprocess.run(cli_args(server.url, *command, option, str(path)), env=clean_environ(),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: Invalid value for {option}: not UTF-8"), done.stderr
    assert redis.dbsize() == 0  # nothing enqueued
