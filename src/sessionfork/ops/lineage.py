"""Lineage: a session's ancestors and descendants, with their states and merge edges, as text,
JSON or a Mermaid graph.

Descendants come from the children index (``keys.session_children``), never from a keyspace
scan: one pipelined round trip per generation (and one per ancestor). Each node's state and merge
come from the same read of its record (``records.STATE_FIELDS``: what ``Registry.state_of`` reads).
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import msgspec
from msgspec import UNSET

from ..core import errors, keys, records, rules, wire
from ..core.registry import Registry
from ..core.wire import Header, MergedInto, SessionStateName

_FIELDS = (*records.HEADER_FIELDS, *records.STATE_FIELDS, "edits")


class Node(msgspec.Struct, rename="camel", kw_only=True):
    """One session in a lineage tree (wire shape of ``sessionfork tree --format json``)."""

    id: str
    seed_length: int
    live: bool
    """It has a live instance (appends go in): ``state`` live, merged or abandoned."""
    state: SessionStateName
    """``live``, ``merged`` (into an ancestor, until its branch TTL disposes it), ``abandoned`` (by
    a select) or ``disposed`` (``Registry.state_of``; deleted sessions are not listed)."""
    created_at: int
    children: list[Node] = msgspec.field(default_factory=list)
    edits: int | msgspec.UnsetType = UNSET
    """How many events the fork appended right after the seed (``edits``); absent: none."""
    kept_from: int | msgspec.UnsetType = UNSET
    """A summary child: its seq 0 summarises its parent's seqs ``0 .. keptFrom-1``; absent: none."""
    merged_into: MergedInto | msgspec.UnsetType = UNSET
    """Its latest merge: the ancestor, the merge's first seq there, the request id (kept once
    disposed); absent: never merged."""
    abandoned_by: str | msgspec.UnsetType = UNSET
    """The select request that abandoned it; absent: not abandoned."""


class MergeEdge(msgspec.Struct, rename="camel", kw_only=True):
    """A merge edge: session ``child`` merged into ``into`` (an ancestor), the merge's turn
    starting at ``into``'s seq ``seq``, by ``request_id`` (``""``: none)."""

    child: str
    into: str
    seq: int
    request_id: str


class Lineage(msgspec.Struct, rename="camel", kw_only=True):
    """``ancestors`` oldest first; ``root`` is the asked session with all its descendants;
    ``merges`` the merge edges of the listed sessions (each one's latest merge), tree order."""

    ancestors: list[Node]
    root: Node
    merges: list[MergeEdge] = msgspec.field(default_factory=list)


def lineage(registry: Registry, session_id: str, *, max_nodes: int = 10_000) -> Lineage:
    """The lineage of ``session_id`` (``SESSION_NOT_FOUND`` if never created, or deleted).

    Deleted sessions are left out: ancestors stop above the nearest deleted one; the descendants
    of a deleted session are listed under its nearest listed ancestor."""
    sid = rules.check_id(session_id)
    root = _read(registry, sid)
    if root is None:
        raise errors.not_found(sid)
    ancestors: list[Node] = []
    parent = root[1].parent_session
    while parent is not UNSET and len(ancestors) < max_nodes:
        found = _read(registry, parent)
        if found is None:
            break  # a deleted ancestor: the walk ends there
        ancestors.insert(0, found[0])
        parent = found[1].parent_session
    # (node the children attach to, session whose children index is read): the descendants of a
    # deleted session (a tombstone that still pins its log) attach to its nearest listed ancestor.
    frontier = [(root[0], root[0].id)]
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
            pipe.hmget(keys.session(cid), list(_FIELDS))
        next_frontier = []
        for (node, cid), fields in zip(ids, pipe.execute(), strict=True):
            made = _node(cid, fields)
            if made is None:
                if fields[3] is not None:  # deleted: a tombstone whose descendants are listed
                    next_frontier.append((node, cid))
                continue
            node.children.append(made[0])
            next_frontier.append((made[0], cid))
            count += 1
        frontier = next_frontier
    return Lineage(ancestors=ancestors, root=root[0], merges=_edges([*ancestors, root[0]]))


def _read(registry: Registry, sid: str) -> tuple[Node, Header] | None:
    """One session's node and header, in one read; ``None`` when deleted or never created."""
    fields: list[bytes | str | None] = registry.redis.hmget(keys.session(sid), list(_FIELDS))
    return _node(sid, fields)


def _node(sid: str, fields: list[bytes | str | None]) -> tuple[Node, Header] | None:
    raw, cwd, parent, instance, deleted, merged, abandoned, edits = fields
    state = records.decode_state(sid, raw, instance, deleted, merged, abandoned)
    if raw is None or state is None or state.state == "deleted":
        return None
    header = records.decode_header(sid, raw, cwd, parent)
    seed = 0 if header.seed_length is UNSET else header.seed_length
    node = Node(id=sid, seed_length=seed, live=instance is not None, state=state.state, created_at=header.created_at,
                edits=UNSET if edits is None else int(edits), kept_from=header.kept_from,
                merged_into=state.merged_into, abandoned_by=state.abandoned_by)
    return node, header


def _edges(top: list[Node]) -> list[MergeEdge]:
    out: list[MergeEdge] = []

    def visit(node: Node) -> None:
        if not isinstance(node.merged_into, msgspec.UnsetType):
            m = node.merged_into
            out.append(MergeEdge(child=node.id, into=m.session, seq=m.seq, request_id=m.request_id))

    for node in top[:-1]:
        visit(node)

    def walk(node: Node) -> None:
        visit(node)
        for child in node.children:
            walk(child)

    walk(top[-1])
    return out


def state_text(node: Node) -> str:
    """The node's state as ``describe`` words it."""
    return describe(node.state, node.merged_into, node.abandoned_by)


def describe(state: SessionStateName, merged_into: MergedInto | msgspec.UnsetType,
             abandoned_by: str | msgspec.UnsetType) -> str:
    """``live``, ``disposed``, ``merged into p @8`` (the merge's first seq there), ``abandoned by
    r1`` (the select's request id), or ``disposed, merged into p @8``."""
    parts: list[str] = [] if state in ("merged", "abandoned") else [state]
    if not isinstance(merged_into, msgspec.UnsetType):
        parts.append(f"merged into {merged_into.session} @{merged_into.seq}")
    if not isinstance(abandoned_by, msgspec.UnsetType):
        parts.append(f"abandoned by {abandoned_by or '(no request id)'}")
    return ", ".join(parts)


def seed_text(node: Node) -> str:
    """``seed 8``, or ``seed 8 + 2 edits`` for a child whose fork appended edits, and
    ``(summary of 0-6)`` for a summary child (the parent's seqs its first event replaced)."""
    return f"seed {node.seed_length}" + ("" if node.edits is UNSET else f" + {node.edits} edits") + \
        ("" if node.kept_from is UNSET else f" (summary of 0-{node.kept_from - 1})")


def _label(node: Node) -> str:
    when = datetime.fromtimestamp(node.created_at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
    edits = "" if node.edits is UNSET else f"  edits={node.edits}"
    edits += "" if node.kept_from is UNSET else f"  summary=0-{node.kept_from - 1}"
    return f"{node.id}  seed={node.seed_length}{edits}  {state_text(node)}  {when}Z"


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
    """A Mermaid flowchart: fork edges labelled with the child's seed length, merge edges dashed
    from the merged child to the ancestor it merged into, labelled ``merged @<seq>``; merged,
    abandoned and disposed nodes each have their class (``classDef``)."""
    out = ["graph TD"]
    nodes = [*tree.ancestors, tree.root]
    ids = {n.id: f"n{i}" for i, n in enumerate(nodes)}

    def name(sid: str) -> str:
        if sid not in ids:
            ids[sid] = f"n{len(ids)}"
        return ids[sid]

    def declare(node: Node) -> None:
        style = "" if node.state == "live" else f":::{node.state}"
        out.append(f'    {name(node.id)}["{node.id}"]{style}')

    for node in nodes:
        declare(node)
    for a, b in itertools.pairwise(nodes):
        out.append(f"    {name(a.id)} -->|{seed_text(b)}| {name(b.id)}")

    def walk(node: Node) -> None:
        for child in node.children:
            declare(child)
            out.append(f"    {name(node.id)} -->|{seed_text(child)}| {name(child.id)}")
            walk(child)

    walk(tree.root)
    for edge in tree.merges:
        if edge.into not in ids:  # an ancestor above the listed ones (past a deleted one)
            out.append(f'    {name(edge.into)}["{edge.into}"]')
        out.append(f"    {name(edge.child)} -.->|merged @{edge.seq}| {name(edge.into)}")
    out.append("    classDef disposed stroke-dasharray: 5 5")
    out.append("    classDef merged fill:#ddf4ff,stroke:#0969da")
    out.append("    classDef abandoned fill:#f6f8fa,stroke:#8c959f,color:#8c959f,stroke-dasharray: 2 2")
    return "\n".join(out)
