"""`sessionfork tree`: ancestors and descendants from the children index, as text, JSON and Mermaid."""

from __future__ import annotations

import json
import subprocess
import sys

from redis import Redis

from sessionfork import NewEvent, Registry, fork
from sessionfork.core import keys
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
    assert set(tree["root"]) == {"id", "seedLength", "live", "createdAt", "children"}


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
