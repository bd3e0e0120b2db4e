"""Summary seeds in the library against a real server: a child whose log is one
``session/summary`` event then the source's events ``keepFrom…`` renumbered from seq 1, stored by
reference; the ``keepFrom`` rule; forks of a summary child never bring the summarised events
back; deleting the source never changes a byte of the child. Through the queue and the raw
any-language path: ``test_summary_queue``; on a cluster: ``test_compose_cluster``."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from helpers import turn
from msgspec import UNSET
from redis import Redis
from waits import outcome_of

import sessionfork
from sessionfork.core import forks, keys, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Event, NewEvent
from sessionfork.ops.jsonl import path_for
from sessionfork.ops.persist import JsonlBackend

S = sessionfork.Summary


@pytest.fixture
def src(registry: Registry) -> str:
    """Session "src": three finished turns (12 events), a todo after the second."""
    registry.append(registry.create("src", cwd="/w"), [*turn(1), *turn(2), NewEvent("todo/write", {"t": 1}), *turn(3)])
    return "src"


def shape(events: list[Event]) -> list[tuple[str, int, object]]:
    return [(e.type, e.seq, e.data) for e in events]


def test_summary_child_log_header_and_renumbering(registry: Registry, src: str) -> None:
    source = registry.events(src)
    child = forks.fork(registry, src, "c", summary=S(keep_from=9, data={"text": "two turns"}))
    assert (child.parent_session, child.seed_length, child.kept_from) == ("src", 5, 9)
    log = outcome_of(lambda: registry.events("c"))
    assert isinstance(log, list), log  # the child reads (its summary event stored with it)
    assert log[0].type == "session/summary" and log[0].seq == 0
    assert log[0].data == {"summary": {"text": "two turns"}, "summarizes": {"session": "src", "fromSeq": 0, "toSeq": 8}}
    kept = [(e.type, e.time, e.data, e.extra) for e in source[9:]]
    assert [(e.type, e.time, e.data, e.extra) for e in log[1:]] == kept
    assert [e.seq for e in log] == list(range(5))
    assert registry.header("c") == child
    assert registry.events("c", 2, 4) == log[2:4]
    # a plain child's header has no keptFrom
    assert forks.fork(registry, src, "plain").kept_from is UNSET
    assert registry.header("plain").kept_from is UNSET
    assert len(json.loads(registry.redis.hget(keys.session("plain"), "header") or b"")) == 3  # no keptFrom item
    assert len(json.loads(registry.redis.hget(keys.session("c"), "header") or b"")) == 4  # [.., seedLength, keptFrom]


def test_summary_with_boundary_and_edits(registry: Registry, src: str) -> None:
    retry = [NewEvent("turn/start", {"turn": 3}), NewEvent("user/message", {"text": "again"})]
    child = forks.fork(registry, src, "c", boundary=8, summary=S(keep_from=4, data="s1"), edits=retry)
    assert (child.seed_length, child.kept_from) == (6, 4)
    log = registry.events("c")
    assert [e.type for e in log] == ["session/summary", *(e.type for e in registry.events(src)[4:9]),
                                     "turn/start", "user/message"]
    assert [e.seq for e in log] == list(range(8))
    assert registry.last_turn_end("c") == 4  # the source's turn/end at 7, renumbered
    # keep nothing: K = E + 1
    empty = forks.fork(registry, src, "e", boundary=7, summary=S(keep_from=8, data=None))
    assert empty.seed_length == 1 and registry.last_turn_end("e") is None
    assert [e.type for e in registry.events("e")] == ["session/summary"]


@pytest.mark.parametrize(("keep_from", "why"), [
    (0, "expected 1 to 13 (the snapshot's 13 events)"), (14, "expected 1 to 13 (the snapshot's 13 events)"),
    (3, "event 2 is inside the turn opened at seq 0"), (12, "event 11 is inside the turn opened at seq 9"),
    # beyond the 64-bit range (the summary event's toSeq K-1 could not be written): the rule's
    # answer, as a boundary's, never an INVALID_REQUEST about the summary event
    *((k, "expected 1 to 13 (the snapshot's 13 events)") for k in (-(2**63), -(10**30), 2**64 + 1, 10**30)),
])
def test_keep_from_rule(registry: Registry, src: str, keep_from: int, why: str) -> None:
    with pytest.raises(ForkError) as info:
        forks.fork(registry, src, "c", summary=S(keep_from=keep_from, data=1))
    assert info.value.code == ErrorCode.INVALID_BOUNDARY
    assert info.value.message == f'cannot summarise session "src" before keepFrom {keep_from}: {why}'
    assert not registry.exists("c")


def test_keep_from_is_checked_against_the_ancestor_holding_it(registry: Registry, src: str) -> None:
    """keepFrom inside the source's inherited seed: the rule on the ancestor's own turn index."""
    forks.fork(registry, src, "mid")
    registry.append("mid", turn(4))
    with pytest.raises(ForkError, match="event 5 is inside the turn opened at seq 4"):
        forks.fork(registry, "mid", "c", summary=S(keep_from=6, data=1))
    assert forks.fork(registry, "mid", "c", summary=S(keep_from=8, data=1)).seed_length == 10
    assert [e.data for e in registry.events("c")[1:]] == [e.data for e in registry.events("mid")[8:]]


def test_forks_of_a_summary_child_never_bring_summarised_events_back(registry: Registry, src: str) -> None:
    forks.fork(registry, src, "c", summary=S(keep_from=9, data="sum"))
    registry.append("c", turn(7))
    child_log = registry.events("c")
    plain = forks.fork(registry, "c", "g")
    assert plain.seed_length == 9 and plain.kept_from is UNSET
    assert registry.events("g") == child_log
    # a boundary fork inside the child's seed and inside its own events, each checked on the right log
    assert registry.events(forks.fork(registry, "c", "b1", boundary=4).id) == child_log[:5]
    assert registry.events(forks.fork(registry, "c", "b0", boundary=0).id) == child_log[:1]
    with pytest.raises(ForkError, match="inside the turn opened at seq 1"):
        forks.fork(registry, "c", "bad", boundary=2)
    with pytest.raises(ForkError, match="inside the turn opened at seq 5"):
        forks.fork(registry, "c", "bad", boundary=6)
    assert registry.last_turn_end("b1") == 4 and registry.last_turn_end("b0") is None
    # a summary of the summary child: its own numbering, the first summary gone too
    again = forks.fork(registry, "g", "s2", summary=S(keep_from=5, data="sum2"))
    assert again.kept_from == 5
    log = registry.events("s2")
    assert [e.type for e in log] == ["session/summary", *(e.type for e in child_log[5:])]
    assert all(e.type != "session/summary" or e.seq == 0 for e in log)
    summary_of_summary = forks.fork(registry, "c", "s3", boundary=4, summary=S(keep_from=1, data="x"))
    assert summary_of_summary.seed_length == 5
    assert [e.data for e in registry.events("s3")[1:]] == [e.data for e in child_log[1:5]]
    deep = forks.fork(registry, "s3", "s4", summary=S(keep_from=1, data="y"))
    s4 = registry.events("s4")
    assert deep.seed_length == 5 and s4[0].data["summarizes"] == {"session": "s3", "fromSeq": 0, "toSeq": 0}
    assert [e.data for e in s4[1:]] == [e.data for e in child_log[1:5]]


def test_a_boundary_in_a_summary_childs_seed_is_checked_on_the_owner_by_index(registry: Registry, src: str) -> None:
    """The kept events live in the own log of a forked session ("mid": seedlen 13), whose seqs are
    not the summary child's nor the index in that log: turn.lua maps them."""
    forks.fork(registry, src, "mid")
    registry.append("mid", [*turn(4), *turn(5)])  # mid's own events: seqs 13-20
    forks.fork(registry, "mid", "c", summary=S(keep_from=17, data="four turns"))
    assert [e.data for e in registry.events("c")[1:]] == [e.data for e in registry.events("mid")[17:]]
    with pytest.raises(ForkError) as info:
        forks.fork(registry, "c", "x", boundary=2)
    assert info.value.message == 'cannot fork session "c" at boundary 2: inside the turn opened at seq 1'
    at_end = forks.fork(registry, "c", "y", boundary=4)
    assert at_end.seed_length == 5 and registry.last_turn_end("y") == 4
    registry.append("c", turn(6))
    assert forks.fork(registry, "c", "z", boundary=0).seed_length == 1 and registry.last_turn_end("z") is None


def test_deleting_the_source_keeps_the_childs_bytes(registry: Registry, redis: Redis, src: str) -> None:
    forks.fork(registry, src, "c", summary=S(keep_from=4, data="sum"))
    forks.fork(registry, "c", "g")
    before = {sid: registry.events(sid) for sid in ("c", "g")}
    raw = {k: redis.dump(k) for k in (keys.session("g"), keys.session_log("g"))}
    registry.delete(src)
    registry.delete("c")  # pinned by "g": its summary event stays readable
    assert outcome_of(lambda: registry.events("g")) == before["g"]
    assert {k: redis.dump(k) for k in raw} == raw
    registry.delete("g")  # the last descendant: everything freed
    assert not redis.exists(keys.session_log(src)) and not redis.hexists(keys.session("c"), "summary")


def test_summary_fanout_and_bad_input(registry: Registry, src: str) -> None:
    out = forks.fork_many(registry, src, ["a", "b"], summary=S(keep_from=13, data=[1, 2]))
    assert [h.seed_length for h in out.created] == [1, 1]
    for bad, code in [(S(keep_from=True, data=1), ErrorCode.INVALID_REQUEST),
                      (S(keep_from=1, data={1, 2}), ErrorCode.INVALID_REQUEST), ("s", ErrorCode.INVALID_REQUEST)]:
        with pytest.raises(ForkError) as info:
            forks.fork(registry, src, "z", summary=bad)  # type: ignore[arg-type]
        assert info.value.code == code
    assert not registry.exists("z")


def test_persistence_writes_the_summary_childs_header_and_log(registry: Registry, src: str, tmp_path: Path) -> None:
    forks.fork(registry, src, "c", summary=S(keep_from=9, data={"text": "s"}))
    backend = JsonlBackend(registry, tmp_path, consumer="c1", block_ms=10)
    assert backend.sync("c") == 5
    lines = [json.loads(line) for line in path_for(tmp_path, registry.header("c")).read_bytes().splitlines()]
    assert lines[0] == {"type": "session", "version": lines[0]["version"], "id": "c",
                        "createdAt": lines[0]["createdAt"], "cwd": "/w", "parentSession": "src", "seedLength": 5,
                        "keptFrom": 9}
    assert lines[1:] == [wire.event_to_builtins(e) for e in registry.events("c")]
    assert [line["seq"] for line in lines[1:]] == list(range(5)) and lines[1]["type"] == "session/summary"


def test_lineage_shows_the_summary_range(registry: Registry, src: str) -> None:
    from sessionfork.ops import lineage, lineage_html

    forks.fork(registry, src, "c", summary=S(keep_from=9, data="s"), edits=turn(4)[:1])
    forks.fork(registry, "c", "g", boundary=4)
    tree = lineage.lineage(registry, src)
    (node,) = tree.root.children
    assert (node.id, node.seed_length, node.kept_from, node.edits) == ("c", 5, 9, 1)
    assert node.children[0].kept_from is UNSET
    assert "c  seed=5  edits=1  summary=0-8  live" in lineage.render_text(tree)
    assert "-->|seed 5 + 1 edits (summary of 0-8)|" in lineage.render_mermaid(tree)
    assert "seed 5 + 1 edits (summary of 0-8)" in lineage_html.render_html(tree)
    assert b'"keptFrom":9' in msgspec.json.encode(tree)


def test_diff_maps_the_kept_range(registry: Registry, src: str) -> None:
    from sessionfork.ops import diff

    forks.fork(registry, src, "c", summary=S(keep_from=9, data="s"))
    registry.append("c", turn(5))
    registry.append(src, turn(4))  # the parent goes on: its seqs 9-12 are still the child's 1-4
    found = diff.diff(registry, "c", src)
    assert found.kept == diff.Kept(session="c", from_seq=9, count=4)
    assert (found.shared, found.ancestor, len(found.a.events), len(found.b.events)) == (0, "src", 9, 17)
    assert diff.diff(registry, src, "c").kept == found.kept
    assert "summary child c: its seq 1-4 are the other's seq 9-12 (its seq 0 summarises 0-8)" in \
        diff.render_text(found)
    # a summary child that kept nothing maps nothing; plain diffs have no "kept" in their JSON
    forks.fork(registry, src, "e", boundary=12, summary=S(keep_from=13, data="s"))
    assert diff.diff(registry, "e", src).kept is UNSET
    forks.fork(registry, src, "p")
    assert b"kept" not in msgspec.json.encode(diff.diff(registry, "p", src))
