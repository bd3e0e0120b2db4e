"""A SIGKILLed JSONL persistence backend process catches up, while sessions are written, forked and
disposed, without a duplicate or a gap in any file."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from helpers import kill, stop, turn
from persist_fixtures import expected_lines, file_lines, file_of, fork
from waits import wait_until

from sessionfork.core import wire
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer

# -- a SIGKILLed backend catches up without a duplicate or a gap ---------------------------------

BACKEND = """
import logging, sys
from pathlib import Path
from redis import Redis
from sessionfork.ops.persist import JsonlBackend
from sessionfork.core.registry import Registry
logging.basicConfig(level=logging.WARNING)
port, root = int(sys.argv[1]), Path(sys.argv[2])
JsonlBackend(Registry(Redis(port=port)), root, consumer="killed", block_ms=100, batch=20).run()
"""


class Writer(threading.Thread):
    """Appends a turn to every live session per round, forks some, disposes a few: ``budget`` rounds."""

    def __init__(self, registry: Registry, budget: int) -> None:
        super().__init__(daemon=True)
        self.registry = registry
        self.changed = threading.Condition()
        self.budget = budget
        self.halted = False
        self.rounds = 0
        self.sessions = [registry.create().id for _ in range(3)]
        self.live = list(self.sessions)
        self.errors: list[BaseException] = []

    def allow(self, rounds: int) -> None:
        with self.changed:
            self.budget += rounds
            self.changed.notify_all()

    def halt(self) -> None:
        with self.changed:
            self.halted = True
            self.changed.notify_all()

    def run(self) -> None:
        try:
            while True:
                with self.changed:
                    self.changed.wait_for(lambda: self.halted or self.rounds < self.budget)
                    if self.halted:
                        return
                for sid in self.live:
                    self.registry.append(sid, turn(self.rounds))
                if self.rounds % 4 == 1 and len(self.sessions) < 12:
                    children = [fork(self.registry, sid) for sid in self.live[:3]]
                    self.sessions += children
                    self.live += children
                if self.rounds % 9 == 8 and len(self.live) > 3:
                    self.registry.dispose(self.live.pop(3))
                self.rounds += 1
        except BaseException as exc:
            self.errors.append(exc)


def all_files_match(registry: Registry, root: Path, sessions: list[str]) -> bool:
    try:
        return all(file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid) for sid in sessions)
    except (OSError, ValueError, AssertionError):  # missing, torn mid-write, or short: not yet
        return False


def test_sigkilled_backend_catches_up_without_duplicates_or_gaps(registry: Registry, server: EmbeddedServer,
                                                                 root: Path) -> None:
    def start_backend() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", BACKEND, str(server.port), str(root)], stdin=subprocess.DEVNULL)

    def all_rounds(more: int) -> None:
        writer.allow(more)
        wait_until(lambda: writer.rounds >= writer.budget or not writer.is_alive(), 20, "the writer's rounds")

    writer = Writer(Registry(server.client()), budget=150)
    backend = start_backend()
    try:
        writer.start()
        wait_until(lambda: len(list(root.rglob("*.jsonl"))) >= 4, 20, "the backend's first files")
        assert backend.poll() is None, "the backend died before the kill"
        kill(backend)
        all_rounds(10)  # entries pile up while no backend runs
        backend = start_backend()
        all_rounds(10)
        writer.halt()
        writer.join(20)
        assert not writer.errors
        wait_until(lambda: all_files_match(registry, root, writer.sessions), 30, "every file to match the registry")
    finally:
        writer.halt()
        stop(backend)
    assert len(writer.sessions) == 12 and writer.rounds >= 170
    for sid in writer.sessions:
        header, *events = file_lines(file_of(registry, root, sid))
        assert header == expected_lines(registry, sid)[0]
        assert [e["seq"] for e in events] == list(range(registry.length(sid)))  # contiguous, no duplicates
        assert events == [wire.event_to_builtins(e) for e in registry.events(sid)]
    assert sorted(p.name for p in root.rglob("*.jsonl")) == sorted(f"{sid}.jsonl" for sid in writer.sessions)
