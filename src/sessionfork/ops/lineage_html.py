"""The lineage as one self-contained HTML page (``sessionfork tree ID --format html``).

Plain HTML and CSS, no script, no font or image fetched: the file opens anywhere, offline. The
tree is nested lists (ancestors down to the asked session, then all its descendants), each
session a card with its id, its state (live, merged, abandoned or disposed), seed length and
creation time (and, from the asked session down, how many children it has); a merged session's
card names the ancestor it merged into and the seq there (its merge edge), an abandoned one's
the select request; the asked session is marked. Every card carries ``data-id`` and
``data-state`` (and ``data-merged-into``) so tools can find a node in the DOM.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from html import escape

import msgspec

from .lineage import Lineage, Node, seed_text

_STYLE = """
:root { color-scheme: light; --line: #b8c2cc; --live: #1a7f37; --gone: #8c959f; --mark: #bf3989; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px; font: 13px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: #1f2328; background: #ffffff; }
h1 { font-size: 18px; margin: 0 0 4px; }
p.summary { margin: 0 0 18px; color: #57606a; }
code, .id { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 26px; position: relative; }
ul.tree { padding-left: 0; }
ul.tree ul::before { content: ""; position: absolute; left: 10px; top: 0; bottom: 14px;
                     border-left: 1px solid var(--line); }
li.node { position: relative; margin: 3px 0; }
ul.tree ul > li.node::before { content: ""; position: absolute; left: -16px; top: 13px; width: 14px;
                               border-top: 1px solid var(--line); }
.card { display: inline-flex; gap: 10px; align-items: baseline; padding: 3px 10px; border: 1px solid #d0d7de;
        border-radius: 6px; background: #f6f8fa; white-space: nowrap; }
.node.disposed > .card { background: #ffffff; border-style: dashed; color: var(--gone); }
.node.ancestor > .card { background: #ffffff; }
.node.requested > .card { border: 2px solid var(--mark); background: #ffeff7; }
.state { font-size: 11px; font-weight: 600; text-transform: uppercase; letter-spacing: .04em; }
.state.live { color: var(--live); }
.state.disposed, .state.abandoned { color: var(--gone); }
.state.merged { color: #0969da; }
.node.abandoned > .card { border-style: dotted; color: var(--gone); }
.node.merged > .card { border-color: #0969da; }
.merge { color: #0969da; }
.seed, time, .kids { color: #57606a; }
.mark { color: var(--mark); font-weight: 700; }
"""


def _when(ms: int) -> tuple[str, str]:
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"), moment.strftime("%Y-%m-%d %H:%M:%S")


def _card(node: Node, role: str) -> str:
    iso, shown = _when(node.created_at)
    state = node.state
    mark = '<span class="mark">&#9664; requested</span>' if role == "requested" else ""
    n = len(node.children)
    kids = f'<span class="kids">{n} {"child" if n == 1 else "children"}</span>' if n and role != "ancestor" else ""
    merge = into = ""
    if not isinstance(node.merged_into, msgspec.UnsetType):
        m = node.merged_into
        into = f' data-merged-into="{escape(m.session)}" data-merged-at="{m.seq}"'
        merge = f'<span class="merge">&#8631; merged into <code>{escape(m.session)}</code> @{m.seq}</span>'
    if not isinstance(node.abandoned_by, msgspec.UnsetType):
        by = escape(node.abandoned_by or "(no request id)")
        merge += f'<span class="merge">abandoned by <code>{by}</code></span>'
    return (f'<li class="node {role} {state}" data-id="{escape(node.id)}" data-state="{state}"{into}>'
            f'<div class="card"><span class="id">{escape(node.id)}</span><span class="state {state}">{state}</span>'
            f'<span class="seed">{escape(seed_text(node))}</span><time datetime="{iso}">{shown}Z</time>{merge}{kids}'
            f"{mark}</div>")


def _descendants(node: Node) -> Iterator[str]:
    if not node.children:
        return
    yield "<ul>"
    for child in node.children:
        yield _card(child, "descendant")
        yield from _descendants(child)
        yield "</li>"
    yield "</ul>"


def _states(node: Node, counts: dict[str, int]) -> dict[str, int]:
    counts[node.state] = counts.get(node.state, 0) + 1
    for child in node.children:
        _states(child, counts)
    return counts


def render_html(tree: Lineage) -> str:
    """The page: a summary line, then the tree (the asked session marked ``requested``)."""
    counts = _states(tree.root, {})
    for node in tree.ancestors:
        counts[node.state] = counts.get(node.state, 0) + 1
    total = sum(counts.values())
    shown = ", ".join(f"{counts.get(s, 0)} {s}" for s in ("live", "merged", "abandoned", "disposed")
                      if counts.get(s) or s in ("live", "disposed"))
    parts = ['<!doctype html>\n<html lang="en"><head><meta charset="utf-8">',
             f"<title>sessionfork lineage: {escape(tree.root.id)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>Lineage of <code>{escape(tree.root.id)}</code></h1>",
             f'<p class="summary">{total} session(s): {shown}; '
             f"{len(tree.ancestors)} ancestor(s). Seed = events inherited from the parent.</p>",
             '<ul class="tree">']
    for node in tree.ancestors:
        parts.append(_card(node, "ancestor"))
        parts.append("<ul>")
    parts.append(_card(tree.root, "requested"))
    parts.extend(_descendants(tree.root))
    parts.append("</li>")
    parts.extend("</ul></li>" for _ in tree.ancestors)
    parts.append("</ul></body></html>\n")
    return "".join(parts)
