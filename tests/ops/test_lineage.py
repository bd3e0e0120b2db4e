"""`sessionfork tree`: ancestors and descendants from the children index, with their states and merge
edges, as text, JSON and Mermaid."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import turn
from redis import Redis

from sessionfork import NewEvent, Registry, fork
from sessionfork.core import keys, merges
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops.lineage import lineage, render_mermaid, render_text


def family(registry: Registry) -> None:
    root = registry.create("root")
    registry.append(root, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    fork(registry, "root", "a")
    fork(registry, "root", "b")
    fork(registry, "a", "a1")
    fork(registry, "a1", "a1x")
    registry.dispose("b")


def test_descendants_are_all_listed(registry: Registry) -> None:
    family(registry)
    tree = lineage(registry, "root")
    assert [c.id for c in tree.root.children] == ["a", "b"]
    assert [c.id for c in tree.root.children[0].children] == ["a1"]
    assert tree.root.children[0].children[0].children[0].id == "a1x"


def test_ancestors_are_listed_oldest_first(registry: Registry) -> None:
    family(registry)
    tree = lineage(registry, "a1x")
    assert [n.id for n in tree.ancestors] == ["root", "a", "a1"]
    assert tree.root.id == "a1x" and tree.root.seed_length == 2


def test_disposed_children_show_as_not_live(registry: Registry) -> None:
    family(registry)
    b = lineage(registry, "root").root.children[1]
    assert (b.id, b.live) == ("b", False)


def test_listing_descendants_never_scans_the_keyspace(registry: Registry, redis: Redis) -> None:
    family(registry)
    before = _calls(redis, "scan") + _calls(redis, "keys")
    lineage(registry, "root")
    assert _calls(redis, "scan") + _calls(redis, "keys") == before
    assert redis.smembers(keys.session_children("root")) == {b"a", b"b"}


def _calls(redis: Redis, command: str) -> int:
    stats = redis.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_text_and_mermaid_renderings(registry: Registry) -> None:
    family(registry)
    text = render_text(lineage(registry, "a"))
    assert text.splitlines()[0].startswith("root") and "a1x" in text and "└── " in text
    mermaid = render_mermaid(lineage(registry, "root"))
    assert mermaid.startswith("graph TD") and '["a1x"]' in mermaid and "-->|seed 2|" in mermaid


def test_tree_command_json(server: EmbeddedServer, registry: Registry) -> None:
    family(registry)
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "tree", "a",
                          "--format", "json"], capture_output=True, text=True, timeout=60, check=True)
    tree = json.loads(out.stdout)
    assert [n["id"] for n in tree["ancestors"]] == ["root"]
    assert tree["root"]["children"][0]["id"] == "a1"
    assert set(tree["root"]) == {"id", "seedLength", "live", "state", "createdAt", "children"}
    assert tree["merges"] == [] and tree["root"]["state"] == "live"


def ended_family(registry: Registry) -> None:
    """"p" (one turn) with children "a" (merged into p, mode events), "b" (the winner of a select
    over b and c: merged into p), "c" (abandoned by that select), "d" (disposed) and "e" (live),
    each child with a turn of its own; "a1" a child of "a"."""
    registry.append(registry.create("p"), turn(1))
    for kid in ("a", "b", "c", "d", "e"):
        fork(registry, "p", kid)
        registry.append(kid, turn(2))
    fork(registry, "a", "a1")
    merges.merge(registry, "p", "a", mode="events", request_id="m-a")
    merges.select(registry, "p", ["b", "c"], "b", mode="summary", summary={"x": 1}, request_id="s-1")
    registry.dispose("d")


def test_states_and_merge_edges_in_every_rendering(server: EmbeddedServer, registry: Registry) -> None:
    ended_family(registry)
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "tree", "p", "--json"],
                         capture_output=True, text=True, timeout=60, check=True)
    tree = json.loads(out.stdout)
    kids = {n["id"]: n for n in tree["root"]["children"]}
    assert {k: n["state"] for k, n in kids.items()} == {
        "a": "merged", "b": "merged", "c": "abandoned", "d": "disposed", "e": "live"}
    assert tree["root"]["state"] == "live" and kids["a"]["children"][0]["state"] == "live"
    assert kids["a"]["mergedInto"] == {"session": "p", "seq": 4, "requestId": "m-a"}
    assert kids["b"]["mergedInto"] == {"session": "p", "seq": 11, "requestId": "s-1"}
    assert kids["c"]["abandonedBy"] == "s-1" and "mergedInto" not in kids["c"]
    assert "mergedInto" not in kids["e"] and "abandonedBy" not in kids["e"] and "abandonedBy" not in kids["b"]
    assert [kids[k]["live"] for k in "abcde"] == [True, True, True, False, True]  # ended, not disposed yet
    assert tree["merges"] == [{"child": "a", "into": "p", "seq": 4, "requestId": "m-a"},
                              {"child": "b", "into": "p", "seq": 11, "requestId": "s-1"}]
    # From below: the merged child's edge to its ancestor, with the ancestor listed above it.
    below = lineage(registry, "a1")
    assert [n.id for n in below.ancestors] == ["p", "a"] and [e.child for e in below.merges] == ["a"]
    text = render_text(lineage(registry, "p"))
    lines = {line.split()[1] if line.startswith(("├", "└")) else line.split()[0]: line for line in text.splitlines()}
    assert "merged into p @4" in lines["a"] and "merged into p @11" in lines["b"]
    assert "abandoned by s-1" in lines["c"] and "  disposed  " in lines["d"] and "  live  " in lines["e"]
    mermaid = render_mermaid(lineage(registry, "p"))
    assert "\n    n1 -.->|merged @4| n0\n" in mermaid and '    n1["a"]:::merged' in mermaid  # a -> p, dashed
    assert mermaid.count("-.->") == 2 and ":::abandoned" in mermaid and ":::merged" in mermaid
    assert '["c"]:::abandoned' in mermaid and '["d"]:::disposed' in mermaid and '["e"]\n' in mermaid
    # Disposed after its merge: the state says so, the merge edge stays.
    registry.dispose("a")
    node = lineage(registry, "a")
    assert node.root.state == "disposed" and [e.into for e in node.merges] == ["p"]
    assert "disposed, merged into p @4" in render_text(node)


def test_tree_command_missing_session_is_one_line(server: EmbeddedServer) -> None:
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "tree", "nobody"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == 'error: SESSION_NOT_FOUND: session "nobody" not found'


def test_unreachable_server_is_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", "redis://127.0.0.1:1/0", "tree", "x"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
