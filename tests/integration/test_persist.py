"""The JSONL persistence backend against a real server: file contents, redelivery, repair, reclaim, a kill."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import kill, stop, turn
from redis import Redis

from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer, wait_until
from sessionfork.ops.jsonl import path_for
from sessionfork.ops.persist import JsonlBackend

GROUP = "persist"
Factory = Callable[..., JsonlBackend]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "jsonl"


@pytest.fixture
def make_backend(registry: Registry, root: Path) -> Factory:
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


# -- file contents -------------------------------------------------------------------------------


def test_parent_and_forked_child_files_match_registry(registry: Registry, root: Path, make_backend: Factory) -> None:
    parent = session_with_turns(registry, 2)
    child = fork(registry, parent)
    drain(make_backend())
    for sid in (parent, child):
        assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


def test_child_file_holds_inherited_seed_then_own_events(registry: Registry, root: Path,
                                                         make_backend: Factory) -> None:
    parent = session_with_turns(registry, 2)
    child = fork(registry, parent)
    registry.append(child, turn(9))
    drain(make_backend())
    header, *events = file_lines(file_of(registry, root, child))
    assert (header["parentSession"], header["seedLength"]) == (parent, 8)
    assert [e["seq"] for e in events] == list(range(12))
    assert events[:8] == file_lines(file_of(registry, root, parent))[1:]


def test_header_line_starts_with_type_session(registry: Registry, root: Path, make_backend: Factory) -> None:
    sid = registry.create().id
    drain(make_backend())
    assert file_of(registry, root, sid).read_bytes().startswith(b'{"type":"session","version":0,')


def test_new_session_file_holds_only_its_header(registry: Registry, root: Path, make_backend: Factory) -> None:
    sid = registry.create().id
    drain(make_backend())
    assert file_lines(root / "_no-cwd" / f"{sid}.jsonl") == expected_lines(registry, sid)[:1]


def test_session_with_cwd_lands_in_cwd_hash_dir(registry: Registry, root: Path, make_backend: Factory) -> None:
    sid = session_with_turns(registry, 1, cwd="/workspace")
    drain(make_backend())
    assert file_lines(root / "cwd-c52ddf65534b" / f"{sid}.jsonl") == expected_lines(registry, sid)


def test_child_of_cwd_session_lands_in_same_dir(registry: Registry, root: Path, make_backend: Factory) -> None:
    child = fork(registry, session_with_turns(registry, 1, cwd="/workspace"))
    drain(make_backend())
    assert file_lines(root / "cwd-c52ddf65534b" / f"{child}.jsonl") == expected_lines(registry, child)


def test_id_with_colon_is_escaped_in_file_name(registry: Registry, root: Path, make_backend: Factory) -> None:
    registry.create("team:s1")
    drain(make_backend())
    assert (root / "_no-cwd" / "team~003As1.jsonl").is_file()


def test_disposed_session_gets_final_events_written(registry: Registry, root: Path, make_backend: Factory) -> None:
    sid = session_with_turns(registry, 1)
    backend = make_backend()
    drain(backend)
    registry.append(sid, [NewEvent("turn/start"), NewEvent("user/message", {"text": "unanswered"})])
    drain(backend)
    assert len(file_lines(file_of(registry, root, sid))) == 5  # no turn/end: no flush yet
    registry.dispose(sid)
    drain(backend)
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


def test_on_demand_flush_writes_events_of_an_open_turn(registry: Registry, root: Path,
                                                       make_backend: Factory) -> None:
    sid = registry.create().id
    registry.append(sid, [NewEvent("turn/start")])
    registry.flush(sid)
    drain(make_backend())
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


# -- at least once, exactly one line per event ---------------------------------------------------


def test_repeated_flush_entries_write_no_duplicate_lines(registry: Registry, root: Path,
                                                         make_backend: Factory) -> None:
    sid = session_with_turns(registry, 2)
    backend = make_backend()
    drain(backend)
    for _ in range(3):
        registry.flush(sid)
    assert drain(backend) == 3
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


def test_redelivered_entry_after_restart_writes_no_duplicate_lines(registry: Registry, redis: Redis, root: Path,
                                                                   make_backend: Factory) -> None:
    sid = session_with_turns(registry, 2)
    redis.xgroup_create(keys.LIFECYCLE_STREAM, GROUP, id="0")
    delivered = redis.xreadgroup(GROUP, "dead", {keys.LIFECYCLE_STREAM: ">"}, count=100)[0][1]
    make_backend(consumer="dead").sync(sid)  # written, then the consumer died before its ack
    redis.xclaim(keys.LIFECYCLE_STREAM, GROUP, "c1", 0, [entry_id for entry_id, _ in delivered])
    assert drain(make_backend()) == 3
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)
    assert pending(redis) == 0


def test_second_group_replaying_whole_stream_writes_no_duplicates(registry: Registry, root: Path,
                                                                  make_backend: Factory) -> None:
    parent = session_with_turns(registry, 2)
    child = fork(registry, parent)
    drain(make_backend())
    assert drain(make_backend(group="replay", consumer="r1")) == 4
    for sid in (parent, child):
        assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


# -- crash repair --------------------------------------------------------------------------------


TAILS = pytest.mark.parametrize("tail", [b'{"type":"assistant/mess', b"\x00" * 4], ids=["torn-json", "nul-bytes"])


@TAILS
def test_half_written_last_line_is_cut_off_on_next_flush(registry: Registry, root: Path, make_backend: Factory,
                                                         tail: bytes) -> None:
    sid = session_with_turns(registry, 1)
    backend = make_backend()
    drain(backend)
    with file_of(registry, root, sid).open("ab") as f:
        f.write(tail)
    registry.flush(sid)
    drain(backend)
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


@TAILS
def test_new_events_follow_the_last_complete_line(registry: Registry, root: Path, make_backend: Factory,
                                                  tail: bytes) -> None:
    sid = session_with_turns(registry, 1)
    drain(make_backend())
    with file_of(registry, root, sid).open("ab") as f:
        f.write(tail)
    registry.append(sid, turn(1))
    drain(make_backend())
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


def test_unparsable_complete_last_line_is_cut_off(registry: Registry, root: Path, make_backend: Factory) -> None:
    sid = session_with_turns(registry, 1)
    drain(make_backend())
    with file_of(registry, root, sid).open("ab") as f:
        f.write(b'{"type":"turn/st\x00\x00\n')
    registry.flush(sid)
    drain(make_backend())
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


def test_half_written_header_is_written_again(registry: Registry, root: Path, make_backend: Factory) -> None:
    sid = session_with_turns(registry, 1)
    path = file_of(registry, root, sid)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"type":"sess')
    drain(make_backend())
    assert file_lines(path) == expected_lines(registry, sid)


def test_file_of_another_incarnation_is_left_untouched(registry: Registry, redis: Redis, root: Path,
                                                       make_backend: Factory) -> None:
    sid = session_with_turns(registry, 1)
    path = file_of(registry, root, sid)
    path.parent.mkdir(parents=True)
    foreign = b'{"type":"session","version":0,"id":"%s","createdAt":1}\n' % sid.encode()
    path.write_bytes(foreign)
    drain(make_backend())
    assert path.read_bytes() == foreign
    assert pending(redis) == 0


# -- reclaiming ----------------------------------------------------------------------------------


def test_dead_consumer_pending_entries_are_reclaimed(registry: Registry, redis: Redis, root: Path,
                                                     make_backend: Factory) -> None:
    sid = session_with_turns(registry, 2)
    redis.xgroup_create(keys.LIFECYCLE_STREAM, GROUP, id="0")
    assert len(redis.xreadgroup(GROUP, "dead", {keys.LIFECYCLE_STREAM: ">"}, count=100)[0][1]) == 3
    backend = make_backend(consumer="live", claim_idle_ms=50)
    path = file_of(registry, root, sid)
    wait_until(lambda: backend.step() >= 0 and path.exists() and pending(redis) == 0, 10, "entries reclaimed")
    assert file_lines(path) == expected_lines(registry, sid)


def test_own_pending_entries_are_read_again_after_restart(registry: Registry, redis: Redis, root: Path,
                                                          make_backend: Factory) -> None:
    sid = session_with_turns(registry, 2)
    redis.xgroup_create(keys.LIFECYCLE_STREAM, GROUP, id="0")
    redis.xreadgroup(GROUP, "c1", {keys.LIFECYCLE_STREAM: ">"}, count=100)  # read, then "crashed"
    assert drain(make_backend(claim_idle_ms=60_000)) == 3
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)
    assert pending(redis) == 0


def test_failed_write_leaves_entry_pending(registry: Registry, redis: Redis, root: Path,
                                           make_backend: Factory) -> None:
    registry.create()
    root.write_bytes(b"not a directory")
    assert make_backend().step() == 0
    assert pending(redis) == 1


def test_failed_write_is_retried_once_idle(registry: Registry, redis: Redis, root: Path,
                                           make_backend: Factory) -> None:
    sid = registry.create().id
    root.write_bytes(b"not a directory")
    backend = make_backend(claim_idle_ms=50)
    backend.step()
    root.unlink()
    wait_until(lambda: backend.step() >= 0 and pending(redis) == 0, 10, "the failed entry retried")
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


# -- bad entries ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    {"type": "session/renamed", "id": "s1", "len": 0},
    {"type": "session/flush", "id": "a/b", "len": 0},
    {"type": "session/flush", "id": "never-created", "len": 0},
    {"kind": "nothing we know"},
], ids=["unknown-type", "invalid-id", "missing-session", "no-fields-we-know"])
def test_bad_entry_is_acked_without_writing(registry: Registry, redis: Redis, root: Path, make_backend: Factory,
                                            fields: dict[str, Any]) -> None:
    registry.create("s1")
    redis.xadd(keys.LIFECYCLE_STREAM, fields)
    assert drain(make_backend()) == 2
    assert pending(redis) == 0
    assert [p.name for p in root.rglob("*.jsonl")] == ["s1.jsonl"]


def test_pending_entry_trimmed_from_stream_is_dropped(registry: Registry, redis: Redis,
                                                      make_backend: Factory) -> None:
    registry.create()
    redis.xgroup_create(keys.LIFECYCLE_STREAM, GROUP, id="0")
    ((_, [(entry_id, _)]),) = redis.xreadgroup(GROUP, "c1", {keys.LIFECYCLE_STREAM: ">"}, count=100)
    redis.xdel(keys.LIFECYCLE_STREAM, entry_id)
    assert drain(make_backend(claim_idle_ms=60_000)) == 0
    assert pending(redis) == 0


def test_group_is_created_again_when_stream_vanishes(registry: Registry, redis: Redis, root: Path,
                                                     make_backend: Factory) -> None:
    backend = make_backend()
    drain(backend)
    redis.delete(keys.LIFECYCLE_STREAM)
    sid = registry.create().id
    redis.delete(keys.LIFECYCLE_STREAM)  # the server lost the stream and its group after this
    registry.flush(sid)
    wait_until(lambda: backend.step() >= 0 and file_of(registry, root, sid).exists(), 10, "group recreated")
    assert file_lines(file_of(registry, root, sid)) == expected_lines(registry, sid)


# -- the loop ------------------------------------------------------------------------------------


def test_run_returns_after_max_entries(registry: Registry, make_backend: Factory) -> None:
    session_with_turns(registry, 2)
    assert make_backend().run(max_entries=3) == 3


def test_run_returns_at_once_when_stop_is_set(registry: Registry, make_backend: Factory) -> None:
    registry.create()
    stop_now = threading.Event()
    stop_now.set()
    assert make_backend().run(stop=stop_now) == 0


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


def test_a_child_with_edits_is_written_with_its_header_and_every_event(registry: Registry, root: Path,
                                                                      make_backend: Factory) -> None:
    from sessionfork.core import forks

    parent = session_with_turns(registry, 2)
    edits = [NewEvent("turn/start", {"turn": 9}), NewEvent("user/message", {"text": "retry"}, {"k": 1})]
    child = forks.fork(registry, parent, "edited", boundary=3, edits=edits).id
    drain(make_backend())
    lines = file_lines(file_of(registry, root, child))
    assert lines == expected_lines(registry, child)
    assert (lines[0]["seedLength"], [e["type"] for e in lines[5:]]) == (4, ["turn/start", "user/message"])
