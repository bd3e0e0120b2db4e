"""The JSONL persistence backend's files against a real server: a header line, then every event of
the session (a child's inherited seed first), in the session's cwd directory, under an escaped name;
a branch that ended has its end in the header line, the merge's events in the ancestor's file."""

from __future__ import annotations

from pathlib import Path

from helpers import turn
from persist_fixtures import Factory, drain, expected_lines, file_lines, file_of, fork, session_with_turns

from sessionfork.core import keys, merges
from sessionfork.core.registry import Registry
from sessionfork.core.retention import dispose_ended
from sessionfork.core.wire import NewEvent

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


def test_an_ended_branch_has_its_end_in_its_header_line(registry: Registry, root: Path, make_backend: Factory) -> None:
    parent = session_with_turns(registry, 1)
    won, lost = fork(registry, parent), fork(registry, parent)
    for kid in (won, lost):
        registry.append(kid, turn(2))
    backend = make_backend()
    drain(backend)  # the files exist before the branches end
    before = {sid: file_of(registry, root, sid).read_bytes() for sid in (won, lost)}
    merges.select(registry, parent, [won, lost], won, mode="events", request_id="pick")
    registry.redis.zadd(keys.ENDED_INDEX, {won: 0, lost: 0}, xx=True)
    assert sorted(e.id for e in dispose_ended(registry, now_ms=10, older_than_ms=1)) == sorted([won, lost])
    drain(backend)
    lines = {sid: file_lines(file_of(registry, root, sid)) for sid in (parent, won, lost)}
    assert lines[won][0] == {**expected_lines(registry, won)[0], "mergedInto": {
        "session": parent, "seq": 4, "requestId": "pick"}}
    assert lines[lost][0] == {**expected_lines(registry, lost)[0], "abandonedBy": "pick"}
    assert "abandonedBy" not in lines[won][0] and "mergedInto" not in lines[lost][0]
    for sid in (won, lost):  # line 1 rewritten, every event line as it was
        assert lines[sid][1:] == expected_lines(registry, sid)[1:]
        assert file_of(registry, root, sid).read_bytes().split(b"\n", 1)[1] == before[sid].split(b"\n", 1)[1]
    # The ancestor's file holds the merge's turn as the registry does: ordinary events, with provenance.
    assert lines[parent] == expected_lines(registry, parent)
    assert [e["type"] for e in lines[parent][5:7]] == ["turn/start", "session/merge"]
    assert lines[parent][7]["source"] == {"session": won, "seq": 4}
    assert [p.name for p in root.rglob("*") if p.is_file() and not p.name.endswith(".jsonl")] == []
    # A new backend (no cache) finds the files whole: nothing written, line 1 kept; deletion ends the file.
    again = make_backend(consumer="again")
    assert again.sync(won) == 0 and file_lines(file_of(registry, root, won))[0] == lines[won][0]
    registry.delete(won)
    drain(backend)
    assert file_lines(root / "_no-cwd" / f"{won}.jsonl")[-1]["type"] == "session/deleted"
