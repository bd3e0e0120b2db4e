"""Crash repair by the JSONL persistence backend: a torn or unparsable last line is cut off, a torn
header written again, and a file of another incarnation of the session left untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import turn
from persist_fixtures import Factory, drain, expected_lines, file_lines, file_of, pending, session_with_turns
from redis import Redis

from sessionfork.core.registry import Registry

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
