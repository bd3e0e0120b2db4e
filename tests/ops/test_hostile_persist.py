"""Every valid id gets a JSONL file: an id whose encoded name would pass the file
system's limit is persisted under its documented hashed name, by ``persist --sync`` (a real
process) and by the daemon, which never leaves its entries pending nor logs a traceback.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import clean_environ, cli_args, turn
from redis import Redis

from sessionfork.core import keys
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import persist
from sessionfork.ops.jsonl import path_for
from sessionfork.ops.persist import JsonlBackend

IDS = ["a" + ":" * 40, "b" + ":" * 60, ":" * 128, "c." + ":-" * 63]


def lines(path: Path) -> list[Any]:
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines()]


@pytest.mark.parametrize("sid", IDS, ids=lambda s: f"{len(s)}chars")
def test_persist_sync_writes_a_file_for_every_valid_id(registry: Registry, server: EmbeddedServer,
                                                       tmp_path: Path, sid: str) -> None:
    registry.create(sid)
    registry.append(sid, turn(1))
    out = subprocess.run(cli_args(server.url, "persist", "--root", str(tmp_path), "--sync", sid),
                         env=clean_environ(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path = path_for(tmp_path, registry.header(sid))
    assert len(path.name.encode()) <= 255
    assert [e["seq"] for e in lines(path)[1:]] == [0, 1, 2, 3]
    assert lines(path)[0]["id"] == sid


def test_the_daemon_persists_long_ids_without_a_traceback_or_a_pending_entry(
        registry: Registry, redis: Redis, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for sid in IDS:
        registry.create(sid)
        registry.append(sid, turn(1))
    entries = redis.xlen(keys.LIFECYCLE_STREAM)
    backend = JsonlBackend(registry, tmp_path, consumer="c", claim_idle_ms=0)
    stop = threading.Event()
    deadline = threading.Timer(30, stop.set)  # a bound, not synchronisation
    deadline.start()
    try:
        with caplog.at_level(logging.WARNING, logger="sessionfork"):
            assert backend.run(stop, max_entries=entries) == entries
    finally:
        deadline.cancel()
    assert redis.xpending(keys.LIFECYCLE_STREAM, "persist")["pending"] == 0
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    for sid in IDS:
        assert len(lines(path_for(tmp_path, registry.header(sid)))) == 5


def test_a_file_system_with_shorter_names_gets_the_hashed_name(registry: Registry, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def short_names(path: Any, flags: int, mode: int = 0o777) -> int:  # eCryptfs allows 143 bytes
        if len(os.path.basename(os.fsencode(path))) > 143:
            raise OSError(errno.ENAMETOOLONG, "File name too long", path)
        return real_open(path, flags, mode)

    sid = "d" + ":" * 40  # 207 bytes encoded: fine for 255, too long for 143
    registry.create(sid)
    registry.append(sid, turn(1))
    monkeypatch.setattr(persist.os, "open", short_names)
    assert JsonlBackend(registry, tmp_path, consumer="c").sync(sid) == 4
    hashed = path_for(tmp_path, registry.header(sid), hashed=True)
    assert "~~" in hashed.name and len(lines(hashed)) == 5
    assert JsonlBackend(registry, tmp_path, consumer="c").sync(sid) == 0  # found again, not rewritten
