"""`sessionfork diff A B`: common ancestor, fork points, divergent tails read through seed references."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from helpers import turn

from sessionfork import NewEvent, Registry, fork
from sessionfork.core import merges, wire
from sessionfork.core.snapshots import Snapshot
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops.diff import diff, render_text, shared_length

HISTORY = 10_000  # shared events: a diff must not read them


def history(registry: Registry, sid: str = "root", turns: int = HISTORY // 4) -> None:
    handle = registry.create(sid)
    events = [e for n in range(turns) for e in turn(n)]
    for i in range(0, len(events), 1000):
        registry.append(handle, events[i:i + 1000])


def turns(events: list[dict[str, object]]) -> list[object]:
    """The turn numbers of the turns that start among ``events``."""
    return [e["data"]["turn"] for e in events if e["type"] == "turn/start"]  # type: ignore[index]


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the events decoded from Redis (every LRANGE'd item is decoded once)."""
    seen = [0]
    real: Callable[[bytes, int], wire.Event] = wire.decode_stored_event

    def counting(raw: bytes, seq: int) -> wire.Event:
        seen[0] += 1
        return real(raw, seq)

    monkeypatch.setattr(wire, "decode_stored_event", counting)
    return seen


def test_siblings_diff_reads_only_the_divergent_tails(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    history(registry)
    fork(registry, "root", "left")
    fork(registry, "root", "right")
    registry.append("left", turn(9001))
    registry.append("right", [*turn(9002), *turn(9003)])
    reads = count_reads(monkeypatch)
    found = diff(Registry(registry.redis), "left", "right")  # a fresh registry: no cached lineage
    assert reads[0] == 4 + 8
    assert (found.ancestor, found.shared) == ("root", HISTORY)
    assert (found.a.left_at, found.b.left_at) == (HISTORY, HISTORY)
    assert [e["seq"] for e in found.a.events] == list(range(HISTORY, HISTORY + 4))
    assert len(found.b.events) == 8 and turns(found.b.events) == [9002, 9003]
    assert found.a.events == [wire.event_to_builtins(e) for e in registry.events("left", HISTORY)]
    text = render_text(found)
    assert f"shared prefix: {HISTORY} event(s) (seq 0-{HISTORY - 1}), not shown" in text
    assert '"question 0"' not in text and '"question 9001"' in text  # the shared prefix is never printed


def test_ancestor_against_descendant_and_cousins(registry: Registry) -> None:
    history(registry, turns=3)
    fork(registry, "root", "a")
    registry.append("a", turn(10))
    fork(registry, "a", "a1")
    registry.append("a1", turn(11))
    fork(registry, "root", "b")
    up = diff(registry, "root", "a1")
    assert (up.ancestor, up.shared, up.a.events, up.a.left_at, up.b.left_at) == ("root", 12, [], 12, 12)
    assert len(up.b.events) == 8 and turns(up.b.events) == [10, 11]
    cousins = diff(registry, "a1", "b")
    assert (cousins.ancestor, cousins.shared, len(cousins.a.events), cousins.b.events) == ("root", 12, 8, [])
    same = diff(registry, "a", "a")
    assert (same.ancestor, same.shared, same.a.events, same.b.events) == ("a", 16, [], [])


def test_the_ancestors_side_is_named_the_common_ancestor_not_as_leaving_itself(registry: Registry) -> None:
    history(registry, turns=3)
    fork(registry, "root", "a")
    registry.append("a", turn(10))
    up = render_text(diff(registry, "root", "a")).splitlines()
    assert "A root (live): the common ancestor; length 12; 0 event(s) after the shared prefix" in up
    assert "B a (live): left root at seq 12; length 16; 4 event(s) after the shared prefix" in up
    down = render_text(diff(registry, "a", "root"))
    assert "B root (live): the common ancestor; length 12" in down and "left root" not in down.split("B root")[1]
    same = render_text(diff(registry, "a", "a"))
    assert "left a" not in same and same.count("(live): the common ancestor; length 16") == 2


def test_boundary_fork_point_comes_from_the_seed_references(registry: Registry) -> None:
    """A child forked at an earlier seq than its parent's length (a boundary fork) is placed by its
    own seedLength and seed references, not by the parent's length."""
    history(registry, turns=5)  # 20 events
    snap = Snapshot(source=registry.header("root"), length=8, seed_length=0, segments=())
    registry.create_child(snap, "early")
    registry.append("early", turn(50))
    fork(registry, "root", "late")
    found = diff(registry, "early", "late")
    assert (found.ancestor, found.shared, found.a.left_at, found.b.left_at) == ("root", 8, 8, 20)
    assert len(found.a.events) == 4 and turns(found.a.events) == [50]
    assert [e["seq"] for e in found.b.events] == list(range(8, 20))


def test_shared_length_walks_pieces_without_events() -> None:
    assert shared_length([("r", 0, 5), ("a", 0, 3)], [("r", 0, 5), ("b", 0, 2)]) == 5
    assert shared_length([("r", 0, 5)], [("r", 0, 2), ("x", 0, 9)]) == 2
    assert shared_length([("r", 0, 2), ("r", 2, 4)], [("r", 0, 4)]) == 4
    assert shared_length([("r", 0, 4)], [("s", 0, 4)]) == 0


def test_cli_diff_text_json_and_unrelated(server: EmbeddedServer, registry: Registry) -> None:
    history(registry, turns=2)
    fork(registry, "root", "x")
    registry.append("x", [NewEvent("user/message", {"text": "only in x"})])
    fork(registry, "root", "y")
    registry.create("stranger")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "diff", *args],
                              capture_output=True, text=True, timeout=60)

    text = cli("x", "y")
    assert text.returncode == 0, text.stderr
    assert "common ancestor: root" in text.stdout and "only in x" in text.stdout
    assert "question 0" not in text.stdout
    as_json = json.loads(cli("x", "y", "--json").stdout)
    assert as_json["ancestor"] == "root" and as_json["shared"] == 8
    assert as_json["a"]["leftAt"] == 8 and as_json["a"]["events"][0]["data"] == {"text": "only in x"}
    unrelated = cli("x", "stranger")
    assert unrelated.returncode == 1 and unrelated.stdout == ""
    assert "unrelated" in unrelated.stderr and "no common ancestor" in unrelated.stderr
    missing = cli("x", "nobody")
    assert missing.returncode == 1 and "SESSION_NOT_FOUND" in missing.stderr


def test_each_side_shows_its_state_and_merge(server: EmbeddedServer, registry: Registry) -> None:
    history(registry, turns=2)
    for kid in ("won", "lost", "plain"):
        fork(registry, "root", kid)
        registry.append(kid, turn(7))
    merges.select(registry, "root", ["won", "lost"], "won", mode="events", request_id="pick")
    found = diff(registry, "won", "lost")
    assert (found.a.state, found.b.state) == ("merged", "abandoned")
    assert found.a.merged_into == wire.MergedInto(session="root", seq=8, request_id="pick")
    assert found.b.abandoned_by == "pick" and diff(registry, "root", "plain").a.state == "live"
    text = render_text(found)
    assert "A won (merged into root @8): left root" in text and "B lost (abandoned by pick): left" in text
    registry.dispose("plain")
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "diff", "root", "plain",
                          "--json"], capture_output=True, text=True, timeout=60, check=True)
    sides = json.loads(out.stdout)
    assert (sides["a"]["state"], sides["b"]["state"]) == ("live", "disposed")
    assert "mergedInto" not in sides["b"] and "abandonedBy" not in sides["b"]


# -- a deleted common ancestor; unrelated sessions ---------------------------------


def test_siblings_of_a_deleted_parent_still_share_its_events(server: EmbeddedServer, registry: Registry) -> None:
    handle = registry.create("gone")
    registry.append(handle, [*turn(1), NewEvent("todo/write", {"n": 1}), NewEvent("user/message", {"text": "x"})])
    registry.append(handle, turn(2)[:0])
    registry.append(handle, [NewEvent("turn/start", {"turn": 2}), NewEvent("turn/end", {"turn": 2})])
    fork(registry, "gone", "sib-a", boundary=3)  # 4 events of gone
    fork(registry, "gone", "sib-b")  # all 8
    fork(registry, "gone", "sib-c")
    registry.append("sib-b", turn(3))
    registry.append("sib-c", turn(4))
    registry.delete("gone")
    fresh = Registry(registry.redis)
    found = diff(fresh, "sib-b", "sib-c")
    assert (found.ancestor, found.shared) == ("gone", 8)
    assert (found.a.left_at, found.b.left_at) == (8, 8)
    assert turns(found.a.events) == [3] and turns(found.b.events) == [4]
    boundary = diff(fresh, "sib-a", "sib-b")
    assert (boundary.ancestor, boundary.shared, boundary.a.left_at, boundary.b.left_at) == ("gone", 4, 4, 8)
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "diff", "sib-b", "sib-c"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "common ancestor: gone" in out.stdout and "shared prefix: 8 event(s)" in out.stdout


def test_through_a_deleted_middle_ancestor(registry: Registry) -> None:
    history(registry, turns=2)
    fork(registry, "root", "mid")
    registry.append("mid", turn(7))
    fork(registry, "mid", "leaf")
    fork(registry, "root", "aunt")
    registry.delete("mid")
    found = diff(Registry(registry.redis), "leaf", "aunt")
    assert (found.ancestor, found.shared, found.a.left_at, found.b.left_at) == ("root", 8, 8, 8)
    assert turns(found.a.events) == [7]
    mine = diff(Registry(registry.redis), "leaf", "root")
    assert (mine.ancestor, mine.shared) == ("root", 8)


BIG = 100_000


def _max_rss_kib(url: str, a: str, b: str) -> int:
    """Peak RSS (KiB) of a ``sessionfork diff A B`` process."""
    code = ("import resource, runpy, sys\n"
            f"sys.argv = ['sessionfork', '--redis-url', {url!r}, 'diff', {a!r}, {b!r}]\n"
            "try:\n    runpy.run_module('sessionfork', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return int(out.stderr.strip().splitlines()[-1])


def test_unrelated_sessions_read_no_event_whatever_their_length(server: EmbeddedServer, registry: Registry,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    history(registry, "big-x", turns=BIG // 4)
    history(registry, "big-y", turns=BIG // 4)
    fork(registry, "big-x", "kid-1")
    fork(registry, "big-x", "kid-2")
    registry.append("kid-1", turn(1))
    reads = count_reads(monkeypatch)
    found = diff(Registry(registry.redis), "big-x", "big-y")
    assert reads[0] == 0  # not one event read to say "unrelated"
    assert found.ancestor is None and found.shared == 0
    assert (found.a.length, found.b.length, found.a.events, found.b.events) == (BIG, BIG, [], [])
    unrelated, siblings = _max_rss_kib(server.url, "big-x", "big-y"), _max_rss_kib(server.url, "kid-1", "kid-2")
    print(f"peak RSS of diff: unrelated {BIG:,}-event sessions {unrelated / 1024:.1f} MiB, "
          f"siblings {siblings / 1024:.1f} MiB")
    assert unrelated < siblings + 8 * 1024  # the same as a small diff, not the logs' size
