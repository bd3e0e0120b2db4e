"""`sessionfork tree ID --format html`: one self-contained page, rendered in headless Chromium: every
node, its state and its merge edge."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from browser import png_pixels, render
from helpers import turn

from sessionfork import Registry
from sessionfork.core import merges
from sessionfork.core.forks import fork_many
from sessionfork.embedded import EmbeddedServer


def big_family(registry: Registry) -> list[str]:
    """root, 10 children, 99 grandchildren each: 1,001 sessions (some disposed); all ids."""
    root = registry.create("root")
    registry.append(root, [*turn(1), *turn(2)])
    kids = [f"c{i}" for i in range(10)]
    fork_many(registry, "root", kids)
    ids = ["root", *kids]
    for kid in kids:
        grandkids = [f"{kid}.g{j:02d}" for j in range(99)]
        registry.append(kid, turn(3))
        fork_many(registry, kid, grandkids)
        ids += grandkids
    for gone in ("c3", "c7.g05", "c9.g98"):
        registry.dispose(gone)
    return ids


def page_of(server: EmbeddedServer, session: str, path: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "tree", session,
                          "--format", "html"], capture_output=True, text=True, timeout=120, check=True)
    path.write_text(out.stdout)
    return out.stdout


def cards(dom: str) -> dict[str, str]:
    """``data-id`` -> the node's class attribute, for every session card in the DOM."""
    return {m.group(2): m.group(1) for m in re.finditer(r'<li class="([^"]*)" data-id="([^"]+)"', dom)}


def test_a_thousand_node_page_renders_every_node(server: EmbeddedServer, registry: Registry, tmp_path: Path) -> None:
    ids = big_family(registry)
    html = page_of(server, "root", tmp_path / "lineage.html")
    # Self-contained: no script, nothing that could be fetched.
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "url(" not in html and "@import" not in html and "<link" not in html and "<img" not in html
    dom = render(tmp_path / "lineage.html", tmp_path / "shot.png")
    found = cards(dom)
    assert sorted(found) == sorted(ids) and len(found) == 1001
    assert "requested" in found["root"].split() and sum("requested" in c.split() for c in found.values()) == 1
    assert {i for i, c in found.items() if "disposed" in c.split()} == {"c3", "c7.g05", "c9.g98"}
    assert "1001 session(s): 998 live, 3 disposed" in dom
    assert re.search(r'data-id="root"[^>]*>.*?<span class="kids">10 children</span>', dom)
    assert re.search(r'data-id="c4"[^>]*>.*?<span class="kids">99 children</span>', dom)
    width, height, rows = png_pixels((tmp_path / "shot.png").read_bytes())
    assert (width, height) == (1280, 900)
    pixels = [row[x:x + 3] for row in rows[::4] for x in range(0, len(row), 12)]
    colours = set(pixels)
    inked = sum(1 for p in pixels if p != b"\xff\xff\xff") / len(pixels)
    assert len(colours) > 10 and 0.02 < inked < 0.9, (len(colours), inked)


def test_ancestors_and_the_marked_session(server: EmbeddedServer, registry: Registry, tmp_path: Path) -> None:
    root = registry.create("top")
    registry.append(root, turn(1))
    fork_many(registry, "top", ["mid"])
    registry.append("mid", turn(2))
    fork_many(registry, "mid", ["asked"])
    registry.append("asked", turn(3))
    fork_many(registry, "asked", ["leaf-a", "leaf-b", "leaf-c"])
    registry.dispose("leaf-b")
    registry.append("leaf-a", turn(4))
    merges.select(registry, "asked", ["leaf-a", "leaf-c"], "leaf-a", mode="summary", summary="<b>ok</b>",
                  request_id="pick-1")
    page_of(server, "asked", tmp_path / "small.html")
    dom = render(tmp_path / "small.html", tmp_path / "small.png", size=(900, 400))
    found = cards(dom)
    assert list(found) == ["top", "mid", "asked", "leaf-a", "leaf-b", "leaf-c"]  # ancestors first, in order
    assert found["top"].split()[1:] == ["ancestor", "live"] and "requested" in found["asked"].split()
    assert found["leaf-b"].split()[1:] == ["descendant", "disposed"]
    assert found["leaf-a"].split()[1:] == ["descendant", "merged"]
    assert found["leaf-c"].split()[1:] == ["descendant", "abandoned"]
    # The merge edge: the ancestor and its seq (asked had 12 events), and the abandoning request.
    assert re.search(r'data-id="leaf-a" data-state="merged" data-merged-into="asked" data-merged-at="12">.*?'
                     r"merged into <code>asked</code> @12</span>", dom)
    assert "abandoned by <code>pick-1</code>" in dom and "<b>ok" not in dom  # states, not the summary
    assert "6 session(s): 3 live, 1 merged, 1 abandoned, 1 disposed" in dom
    assert re.search(r'data-id="asked".*?seed 8</span><time datetime="\d{4}-\d\d-\d\dT[\d:.]+Z">', dom)
    assert "&#9664; requested" in dom or "\u25c0 requested" in dom
