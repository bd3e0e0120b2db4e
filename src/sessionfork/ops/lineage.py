"""Lineage: a session's ancestors and descendants, as text, JSON or a Mermaid graph.

Descendants come from the children index (``keys.session_children``), never from a keyspace
scan: one pipelined round trip per generation.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import msgspec
from msgspec import UNSET

from ..core import errors, keys, records, rules, wire
from ..core.registry import Registry
from ..core.wire import Header


class Node(msgspec.Struct, rename="camel", kw_only=True):
    """One session in a lineage tree (wire shape of ``sessionfork tree --format json``)."""

    id: str
    seed_length: int
    live: bool
    created_at: int
    children: list[Node] = msgspec.field(default_factory=list)
    edits: int | msgspec.UnsetType = UNSET
    """How many events the fork appended right after the seed (``edits``); absent: none."""
    kept_from: int | msgspec.UnsetType = UNSET
    """A summary child: its seq 0 summarises its parent's seqs ``0 .. keptFrom-1``; absent: none."""


class Lineage(msgspec.Struct, rename="camel", kw_only=True):
    """``ancestors`` oldest first; ``root`` is the asked session with all its descendants."""

    ancestors: list[Node]
    root: Node


def lineage(registry: Registry, session_id: str, *, max_nodes: int = 10_000) -> Lineage:
    """The lineage of ``session_id`` (``SESSION_NOT_FOUND`` if never created, or deleted).

    Deleted sessions are left out: ancestors stop above the nearest deleted one; the descendants
    of a deleted session are listed under its nearest listed ancestor."""
    sid = rules.check_id(session_id)
    header = registry.header(sid)
    ancestors: list[Node] = []
    parent = header.parent_session
    while parent is not UNSET and len(ancestors) < max_nodes:
        try:
            h = registry.header(parent)
        except errors.ForkError:
            break  # a deleted ancestor: the walk ends there

        ancestors.insert(0, _node(h, registry.instance(parent) is not None, _edits_of(registry, parent)))
        parent = h.parent_session
    root = _node(header, registry.instance(sid) is not None, _edits_of(registry, sid))
    # (node the children attach to, session whose children index is read): the descendants of a
    # deleted session (a tombstone that still pins its log) attach to its nearest listed ancestor.
    frontier = [(root, root.id)]
    count = 1
    while frontier and count < max_nodes:
        pipe = registry.redis.pipeline(transaction=False)
        for _, owner in frontier:
            pipe.smembers(keys.session_children(owner))
        child_lists = pipe.execute()
        ids = [(node, wire.text(c)) for (node, _), members in zip(frontier, child_lists, strict=True)
               for c in sorted(members)]
        pipe = registry.redis.pipeline(transaction=False)
        for _, cid in ids:
            pipe.hmget(keys.session(cid), [*records.HEADER_FIELDS, "instance", "deleted", "edits"])
        next_frontier = []
        for (node, cid), (raw, cwd, parent, instance, deleted, edits) in zip(ids, pipe.execute(), strict=True):
            if raw is None:
                if deleted is not None:
                    next_frontier.append((node, cid))
                continue
            child = _node(records.decode_header(cid, raw, cwd, parent), instance is not None, edits)
            node.children.append(child)
            next_frontier.append((child, cid))
            count += 1
        frontier = next_frontier
    return Lineage(ancestors=ancestors, root=root)


def _edits_of(registry: Registry, sid: str) -> bytes | str | None:
    raw: bytes | str | None = registry.redis.hget(keys.session(sid), "edits")
    return raw


def _node(header: Header, live: bool, edits: bytes | str | None = None) -> Node:
    seed = 0 if header.seed_length is UNSET else header.seed_length
    return Node(id=header.id, seed_length=seed, live=live, created_at=header.created_at,
                edits=UNSET if edits is None else int(edits), kept_from=header.kept_from)


def seed_text(node: Node) -> str:
    """``seed 8``, or ``seed 8 + 2 edits`` for a child whose fork appended edits, and
    ``(summary of 0-6)`` for a summary child (the parent's seqs its first event replaced)."""
    return f"seed {node.seed_length}" + ("" if node.edits is UNSET else f" + {node.edits} edits") + \
        ("" if node.kept_from is UNSET else f" (summary of 0-{node.kept_from - 1})")


def _label(node: Node) -> str:
    when = datetime.fromtimestamp(node.created_at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    edits = "" if node.edits is UNSET else f"  edits={node.edits}"
    edits += "" if node.kept_from is UNSET else f"  summary=0-{node.kept_from - 1}"
    return f"{node.id}  seed={node.seed_length}{edits}  {'live' if node.live else 'disposed'}  {when}Z"


def render_text(tree: Lineage, mark: str = "*") -> str:
    """A terminal tree: ancestors down to the asked session (marked), then its descendants."""
    lines: list[str] = []
    depth = 0
    for node in tree.ancestors:
        lines.append("    " * depth + ("└── " if depth else "") + _label(node))
        depth += 1
    lines.append("    " * depth + ("└── " if depth else "") + _label(tree.root) + f"  {mark}")

    def walk(node: Node, prefix: str) -> None:
        for i, child in enumerate(node.children):
            last = i == len(node.children) - 1
            lines.append(prefix + ("└── " if last else "├── ") + _label(child))
            walk(child, prefix + ("    " if last else "│   "))

    walk(tree.root, "    " * depth + ("    " if depth else ""))
    return "\n".join(lines)


def render_mermaid(tree: Lineage) -> str:
    """A Mermaid flowchart; edges are labelled with the child's seed length."""
    out = ["graph TD"]
    nodes = [*tree.ancestors, tree.root]
    ids = {n.id: f"n{i}" for i, n in enumerate(nodes)}

    def name(node: Node) -> str:
        if node.id not in ids:
            ids[node.id] = f"n{len(ids)}"
        return ids[node.id]

    def declare(node: Node) -> None:
        style = "" if node.live else ":::disposed"
        out.append(f'    {name(node)}["{node.id}"]{style}')

    for node in nodes:
        declare(node)
    for a, b in itertools.pairwise(nodes):
        out.append(f"    {name(a)} -->|{seed_text(b)}| {name(b)}")

    def walk(node: Node) -> None:
        for child in node.children:
            declare(child)
            out.append(f"    {name(node)} -->|{seed_text(child)}| {name(child)}")
            walk(child)

    walk(tree.root)
    out.append("    classDef disposed stroke-dasharray: 5 5")
    return "\n".join(out)
