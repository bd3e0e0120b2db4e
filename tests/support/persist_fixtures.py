"""Fixtures and helpers of the JSONL persistence backend tests (``test_persist_*.py``): the files' root,
a backend factory, draining, and what a session's file must hold (built from the registry).

The fixtures are registered under the names ``root`` and ``make_backend``; the conftest.py of the
folders that use them imports them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import turn
from redis import Redis

from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.ops.jsonl import path_for
from sessionfork.ops.persist import JsonlBackend

GROUP = "persist"
Factory = Callable[..., JsonlBackend]


@pytest.fixture(name="root")
def root_fixture(tmp_path: Path) -> Path:
    return tmp_path / "jsonl"


@pytest.fixture(name="make_backend")
def make_backend_fixture(registry: Registry, root: Path) -> Factory:
    def make(**kwargs: Any) -> JsonlBackend:
        options: dict[str, Any] = {"consumer": "c1", "block_ms": 10, **kwargs}
        return JsonlBackend(registry, root, **options)

    return make


def drain(backend: JsonlBackend) -> int:
    """Step until a step finds nothing; returns the entries handled."""
    total = 0
    while handled := backend.step():
        total += handled
    return total


def expected_lines(registry: Registry, sid: str) -> list[dict[str, Any]]:
    """What the file of ``sid`` must hold, built from the registry: header line, then every event."""
    header = {"type": "session", **json.loads(wire.encode_header(registry.header(sid)))}
    return [header, *(wire.event_to_builtins(e) for e in registry.events(sid))]


def file_lines(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), f"{path} ends without a newline"
    return [json.loads(line) for line in raw.split(b"\n")[:-1]]


def file_of(registry: Registry, root: Path, sid: str) -> Path:
    return path_for(root, registry.header(sid))


def pending(redis: Redis) -> int:
    count: int = redis.xpending(keys.LIFECYCLE_STREAM, GROUP)["pending"]
    return count


def session_with_turns(registry: Registry, turns: int, **create: Any) -> str:
    sid = registry.create(**create).id
    for n in range(turns):
        registry.append(sid, turn(n))
    return sid


def fork(registry: Registry, sid: str) -> str:
    return registry.create_child(registry.take_snapshot(sid)).id
