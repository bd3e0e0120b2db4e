"""Portable lineage bundles: a subtree (or a whole lineage) of sessions in one file, and its import
into any store (``export_bundle``, ``import_bundle``).

A bundle is JSON lines, read and written in order, never whole:

1. ``{"bundle": BundleManifest}``: the format version, the root, the session ids (parents before
   children), the counts;
2. ``{"base": {"session": <root>, "events": S}}`` and S event lines (seqs ``0..S-1``): the root's
   seed, materialised once (its ancestors are outside the bundle); absent when the root has none;
3. per session, ``{"session": Entry}`` (header, state, merges, its pin, the record's turn facts)
   then its own events, one line each (the harness's shape, ``{type, seq, time, data, ...}``); a
   deleted session that descendants still read is ``{"tombstone": Tombstone}`` and its own log, a
   freed position as ``null``;
4. ``{"digest": "<sha256 hex of every byte before this line>"}``.

Seeds are not in the file: a session's seed is its parent's events, which the bundle holds (the
root's in the base), so an import writes each seed as references, O(1) per session whatever the
depth, as a fork does. Export reads events a page at a time (``PAGE``): memory holds one page and
the ids, never a log.

An import checks the whole file (its digest, its shape, every id free) before it writes anything,
then writes session by session, parents first, each session's record last; its record
``keys.bundle_import(digest)`` makes a second import of the same bundle a no-op and lets a killed
one resume, with the same ids, when run again.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final, Literal

import msgspec
from msgspec import UNSET, UnsetType

from ..core import errors, keys, lua, records, rules, wire
from ..core.errors import ErrorCode, ForkError
from ..core.registry import Registry
from ..core.snapshots import SUMMARY_MARK, Segments, decode_segments, window
from ..core.wire import Header, MergedInto

FORMAT: Final = 1
"""The bundle format's version (the manifest's ``format``)."""
PAGE: Final = 1000
"""Events read (export) or written (import) per round trip."""
Mode = Literal["subtree", "lineage"]
Progress = Callable[[int, int], None]
"""Called with the number of events just exported or imported, and the bundle's total."""

SCRIPTS = lua.table(lua.Spec("restore", ("record",), ("digest", "fields*"), __package__))


class BundleManifest(msgspec.Struct, rename="camel", kw_only=True):
    """A bundle's first line: what it holds."""

    format: int
    """The format version (``FORMAT``)."""
    root: str
    """The root of the exported subtree (the asked session, or the top of its lineage)."""
    asked: str
    """The session the export was asked for."""
    mode: Mode
    """``subtree``: the asked session and its descendants; ``lineage``: the whole lineage."""
    sessions: list[str]
    """Every session's id, parents before children (the order of the file)."""
    events: int
    """Event lines in the file (the base's and every session's own)."""
    base: int
    """The base's events: the root's seed, materialised once."""


class Entry(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """A session of a bundle: what its record holds beyond its events."""

    header: Header
    state: Literal["live", "merged", "abandoned", "disposed"]
    events: int
    """Its own event lines that follow (seqs from its seed length on)."""
    last: str = ""
    """The type of its last event, seed included (``""``: an empty log)."""
    merged_into: MergedInto | UnsetType = UNSET
    abandoned_by: str | UnsetType = UNSET
    edits: int | UnsetType = UNSET
    summary: Any = UNSET
    """A summary child's first event, the one its seed starts with."""
    need: int | UnsetType = UNSET
    """The first seq of its parent it reads, when not 0 (a summary child: its ``keepFrom``)."""
    last_end: int | UnsetType = UNSET
    """The seq of its newest ``turn/end`` (-1: none); absent: a record without a turn index."""
    seed_end: int | UnsetType = UNSET
    merges: list[tuple[str, str]] = msgspec.field(default_factory=list)
    """Its merges index (``keys.session_merges``), field and value, sorted."""
    disposed_at: int | UnsetType = UNSET
    ended_at: int | UnsetType = UNSET


class Tombstone(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    """A deleted session whose log descendants in the bundle still read."""

    id: str
    deleted: int
    events: int
    """Its own log's positions that follow (a freed one is ``null``)."""
    parent: str | UnsetType = UNSET
    seed_length: int = 0
    kept_from: int | UnsetType = UNSET
    freed: int | UnsetType = UNSET
    last_end: int | UnsetType = UNSET
    seed_end: int | UnsetType = UNSET
    summary: Any = UNSET
    need: int | UnsetType = UNSET
    turns: list[int] = msgspec.field(default_factory=list)
    """Its turn index as stored (release keeps one marker before what its descendants read)."""


class Base(msgspec.Struct, kw_only=True):
    session: str
    events: int


class Imported(msgspec.Struct, rename="camel", kw_only=True):
    """What ``import_bundle`` did (``sessionfork import`` prints it as JSON)."""

    digest: str
    """The bundle's digest (sha256 of its content, hex): its identity in the store."""
    ids: dict[str, str]
    """Each session of the bundle and its id in the store (itself, unless imported with new ids)."""
    sessions: int
    """The bundle's sessions."""
    events: int
    """The bundle's events (its base's and every session's own)."""
    written: int
    """The sessions this call wrote: all of them, fewer for a resumed import, 0 when the bundle was
    imported before (a no-op)."""


_line = msgspec.json.Encoder()
_any = msgspec.json.Decoder()
_manifest = msgspec.json.Decoder(dict[Literal["bundle"], BundleManifest])


class _Item(msgspec.Struct, forbid_unknown_fields=True):
    """A session's line: one of the two."""

    session: Entry | None = None
    tombstone: Tombstone | None = None

    def one(self) -> Entry | Tombstone:
        found = self.session or self.tombstone
        if found is None or (self.session is not None and self.tombstone is not None):
            raise invalid("a session's line holds neither a session nor a tombstone, or both")
        return found


_entry = msgspec.json.Decoder(_Item)
_base = msgspec.json.Decoder(dict[Literal["base"], Base])
_digest = msgspec.json.Decoder(dict[Literal["digest"], str])
_FIELDS = ("header", "cwd", "parent", "instance", "deleted", "mergedinto", "abandoned", "edits", "len", "seedlen",
           "last", "lastend", "seedend", "summary", "keptfrom", "freed")


def invalid(message: str) -> ForkError:
    """``INVALID_BUNDLE``: a file that is not a whole, unchanged bundle, or one this store cannot take."""
    return ForkError(ErrorCode.INVALID_BUNDLE, message)


# -- export ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Found:
    """A session of the walk: its record's fields, its merges, its index scores, its pin."""

    sid: str
    fields: list[Any]
    merges: dict[bytes, bytes]
    disposed: float | None
    ended: float | None
    need: float | None
    own: int = 0
    """Its own events in the bundle: seqs from its header's seed length on."""
    offset: int = 0
    """Where in its own log the first of them is (a session imported without its ancestors keeps
    its seed in its own log)."""
    entry: Entry | Tombstone | None = None


def export_bundle(registry: Registry, session_id: str, out: IO[bytes], *, mode: Mode = "subtree",
                  progress: Progress | None = None, page: int = PAGE) -> BundleManifest:
    """Write the bundle of ``session_id``'s subtree (``mode="subtree"``: it and every descendant) or
    of its whole lineage (``"lineage"``: from its oldest ancestor still there) to ``out``; returns
    its manifest. Events appended to a session after the walk read its record are left out (each
    session's log is read as of then: logs only grow). ``SESSION_NOT_FOUND`` for a session never
    created or deleted, before anything is written (one deleted during the export raises it too:
    what ``out`` holds then has no digest line, so no import takes it). ``progress`` is called with
    each page's event count and the bundle's total; ``page``: events per round trip.
    """
    sid = rules.check_id(session_id)
    redis = registry.redis
    top = _top(registry, sid) if mode == "lineage" else sid
    found = _walk(registry, top)
    if found[0].entry is None or isinstance(found[0].entry, Tombstone):
        raise errors.not_found(sid)
    root = found[0].entry
    base = 0 if root.header.seed_length is UNSET else root.header.seed_length
    manifest = BundleManifest(format=FORMAT, root=top, asked=sid, mode=mode, sessions=[f.sid for f in found],
                              events=base + sum(f.own for f in found), base=base)
    digest = hashlib.sha256()

    def put(line: bytes) -> None:
        digest.update(line)
        out.write(line)

    put(_line.encode({"bundle": manifest}) + b"\n")
    if base:
        put(_line.encode({"base": Base(session=top, events=base)}) + b"\n")
        for start in range(0, base, page):
            events = registry.events(top, start, min(base, start + page))
            for e in events:
                put(wire.encode_event(e) + b"\n")
            if progress:
                progress(len(events), manifest.events)
    for f in found:
        entry = f.entry
        assert entry is not None
        put(_line.encode({"tombstone" if isinstance(entry, Tombstone) else "session": entry}) + b"\n")
        first = entry.seed_length if isinstance(entry, Tombstone) else _seed_length(entry.header)
        log = keys.session_log(f.sid)
        for start in range(0, f.own, page):
            raws = redis.lrange(log, f.offset + start, f.offset + min(f.own, start + page) - 1)
            if len(raws) != min(page, f.own - start):
                raise errors.not_found(f.sid)  # deleted meanwhile: its log freed
            for i, raw in enumerate(raws):
                stored = raw if isinstance(raw, bytes) else raw.encode()
                if stored == b"" and isinstance(entry, Entry):
                    raise errors.not_found(f.sid)  # deleted meanwhile: its log freed
                put(b"null\n" if stored == b"" else
                    wire.encode_event(wire.decode_stored_event(stored, first + start + i)) + b"\n")
            if progress:
                progress(len(raws), manifest.events)
    out.write(_line.encode({"digest": digest.hexdigest()}) + b"\n")
    return manifest


def _seed_length(header: Header) -> int:
    return 0 if header.seed_length is UNSET else header.seed_length


def _top(registry: Registry, sid: str) -> str:
    """The oldest ancestor of ``sid`` that is not deleted (``sid`` itself when it has none): the
    walk goes up through deleted ancestors that descendants still read (their tombstones keep their
    parent), and ends where a record is gone."""
    top = sid
    header, parent = registry.redis.hmget(keys.session(sid), ["header", "parent"])
    if header is None:
        raise errors.not_found(sid)
    seen = {sid}
    while (up := records.parent_of(header, parent)) is not None and up not in seen:
        seen.add(up)
        header, parent, deleted = registry.redis.hmget(keys.session(up), ["header", "parent", "deleted"])
        if header is None and deleted is None:
            break
        if header is not None:
            top = up
    return top


def _walk(registry: Registry, top: str) -> list[_Found]:
    """``top`` and every descendant (tombstones whose descendants are there included), parents
    before children, children sorted by id: one pipelined round trip per generation."""
    redis = registry.redis
    out: list[_Found] = []
    frontier: list[tuple[str | None, str]] = [(None, top)]
    while frontier:
        pipe = redis.pipeline(transaction=False)
        for _, cid in frontier:
            pipe.hmget(keys.session(cid), list(_FIELDS))
            pipe.hgetall(keys.session_merges(cid))
            pipe.zscore(keys.DISPOSED_INDEX, cid)
            pipe.zscore(keys.ENDED_INDEX, cid)
            pipe.llen(keys.session_log(cid))
            pipe.smembers(keys.session_children(cid))
        replies = pipe.execute()
        needs = redis.pipeline(transaction=False)
        for parent, cid in frontier:
            needs.zscore(keys.session_needs(parent or cid), cid)
        need_replies = needs.execute()
        # A tombstone's turn index (its markers may point into its freed prefix): read only for those.
        tombstones = [cid for i, (_, cid) in enumerate(frontier) if replies[6 * i][4] is not None]
        turns = redis.pipeline(transaction=False)
        for cid in tombstones:
            turns.lrange(keys.session_turns(cid), 0, -1)
        turn_lists = dict(zip(tombstones, turns.execute() if tombstones else [], strict=True))
        next_frontier: list[tuple[str | None, str]] = []
        for i, (parent, cid) in enumerate(frontier):
            fields, merges, disposed, ended, llen, children = replies[6 * i: 6 * i + 6]
            found = _Found(cid, fields, merges, disposed, ended, None if parent is None else need_replies[i])
            found.entry = _entry_of(found, int(llen), [int(t) for t in turn_lists.get(cid, [])])
            if found.entry is None:
                if parent is None:
                    raise errors.not_found(cid)
                continue  # deleted and no longer pinned: nothing of it is read
            out.append(found)
            next_frontier.extend((cid, wire.text(c)) for c in sorted(children))
        frontier = next_frontier
    return out


def _int(raw: bytes | None) -> int | UnsetType:
    return UNSET if raw is None else int(raw)


def _entry_of(found: _Found, llen: int, turns: list[int]) -> Entry | Tombstone | None:
    (raw, cwd, parent, instance, deleted, merged, abandoned, edits, length, seedlen, last, lastend, seedend,
     summary, keptfrom, freed) = found.fields
    need = UNSET if found.need is None or found.need == 0 else int(found.need)
    if deleted is not None:
        if seedlen is None:
            return None
        found.own = llen
        return Tombstone(id=found.sid, deleted=int(deleted), events=llen,
                         parent=UNSET if parent is None else wire.text(parent), seed_length=int(seedlen),
                         kept_from=_int(keptfrom), freed=_int(freed), last_end=_int(lastend),
                         seed_end=_int(seedend), summary=UNSET if summary is None else _any.decode(summary),
                         need=need, turns=turns)
    if raw is None:
        return None
    header = records.decode_header(found.sid, raw, cwd, parent)
    state = records.decode_state(found.sid, raw, instance, deleted, merged, abandoned)
    assert state is not None and state.state != "deleted"
    total = int(length or 0)
    stored = total if seedlen is None else int(seedlen)
    found.own = total - _seed_length(header)
    found.offset = _seed_length(header) - stored
    return Entry(header=header, state=state.state, events=found.own, last=wire.text(last or b""),
                 merged_into=state.merged_into, abandoned_by=state.abandoned_by, edits=_int(edits),
                 summary=UNSET if summary is None else _any.decode(summary), need=need,
                 last_end=_int(lastend), seed_end=_int(seedend if seedend is not None else lastend),
                 merges=sorted((wire.text(k), wire.text(v)) for k, v in found.merges.items()),
                 disposed_at=UNSET if found.disposed is None else int(found.disposed),
                 ended_at=UNSET if found.ended is None else int(found.ended))


# -- import ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Checked:
    """What the check of a whole bundle found (no events kept)."""

    digest: str
    manifest: BundleManifest
    parents: set[str] = field(default_factory=set)


def _lines(source: IO[bytes]) -> Iterator[bytes]:
    for line in source:
        if not line.endswith(b"\n"):
            raise invalid("the bundle is truncated (its last line is incomplete)")
        yield line


def check_bundle(source: IO[bytes], *, max_event_bytes: int = 1024 * 1024,
                 compare_base: Callable[[int, list[bytes]], None] | None = None) -> _Checked:
    """Read the whole bundle once and check it: its shape, each event (``type`` text, ``seq`` in
    order, ``time`` an integer, at most ``max_event_bytes`` stored), each seed within its parent's
    log, and its digest (``INVALID_BUNDLE`` for a truncated, corrupted or foreign file).
    ``compare_base`` is given each page of base events (the first seq, their lines)."""
    digest = hashlib.sha256()
    lines = _lines(source)

    def take(what: str) -> bytes:
        line = next(lines, None)
        if line is None:
            raise invalid(f"the bundle is truncated (it ends before {what})")
        digest.update(line)
        return line

    try:
        manifest = _manifest.decode(take("its manifest"))["bundle"]
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
        raise invalid(f"not a sessionfork bundle (line 1: {exc})") from None
    if manifest.format != FORMAT:
        raise invalid(f"bundle format {manifest.format} is not {FORMAT}, the one this version reads")
    if not manifest.sessions or manifest.sessions[0] != manifest.root or len(set(manifest.sessions)) != len(
            manifest.sessions):
        raise invalid("the manifest's sessions do not start with its root, or repeat an id")
    for sid in manifest.sessions:
        rules.check_id(sid)
    checked = _Checked("", manifest)
    count = 0

    def events(first: int, n: int, holes: bool, what: str) -> None:
        nonlocal count
        page: list[bytes] = []
        for i in range(n):
            line = take(f"event {first + i} of {what}")
            try:
                value = _any.decode(line)
            except msgspec.DecodeError:
                raise invalid(f"event {first + i} of {what} is not JSON") from None
            if value is None and holes:
                continue
            if not isinstance(value, dict) or value.get("seq") != first + i or not isinstance(value.get("type"), str) \
                    or not value["type"] or type(value.get("time")) is not int:
                raise invalid(f"line of event {first + i} of {what} is not that event")
            if len(_stored(value)[0]) > max_event_bytes:
                raise invalid(f"event {first + i} of {what} is over the limit of {max_event_bytes} bytes")
            if compare_base is not None and what == "the base":
                page.append(line)
                if len(page) == PAGE:
                    compare_base(first + i + 1 - PAGE, page)
                    page = []
        if compare_base is not None and what == "the base" and page:
            compare_base(first + n - len(page), page)
        count += n

    if manifest.base:
        base = _decode(_base, take("the base"), "the base")["base"]
        if base.session != manifest.root or base.events != manifest.base:
            raise invalid("the base is not the root's seed the manifest names")
        events(0, base.events, False, "the base")
    lengths: dict[str, int] = {}  # each session's length (seed included): what its children may read
    for i, sid in enumerate(manifest.sessions):
        entry = _decode(_entry, take(f"session {sid}"), f"session {sid}").one()
        own_id = entry.id if isinstance(entry, Tombstone) else entry.header.id
        if own_id != sid:
            raise invalid(f"session {rules.echo(own_id)} is not {rules.echo(sid)}, the manifest's next")
        parent = entry.parent if isinstance(entry, Tombstone) else entry.header.parent_session
        if i == 0 and isinstance(entry, Tombstone):
            raise invalid("the bundle's root is a tombstone")
        first = entry.seed_length if isinstance(entry, Tombstone) else _seed_length(entry.header)
        kept = entry.kept_from if isinstance(entry, Tombstone) else entry.header.kept_from
        if i == 0 and first != manifest.base:
            raise invalid(f"the root's seed is {first} events, not the base's {manifest.base}")
        if i:
            if not isinstance(parent, str) or parent not in lengths:
                raise invalid(f"session {rules.echo(sid)}'s parent is not before it in the bundle")
            end = first if isinstance(kept, UnsetType) else kept + first - 1
            if first < 0 or end > lengths[parent] or (not isinstance(kept, UnsetType) and (kept < 1 or first < 1)):
                raise invalid(f"session {rules.echo(sid)}'s seed is not within its parent's {lengths[parent]} events")
            checked.parents.add(parent)
        lengths[sid] = first + entry.events
        events(first, entry.events, isinstance(entry, Tombstone), f"session {sid}")
    if count != manifest.events:
        raise invalid(f"the bundle holds {count} events, not the {manifest.events} its manifest counts")
    expected = digest.hexdigest()
    last = next(lines, None)
    if last is None:
        raise invalid("the bundle is truncated (it ends before its digest)")
    found = _decode(_digest, last, "the digest")["digest"]
    if found != expected:
        raise invalid(f"the bundle is corrupted: its content's digest is {expected}, not {found}")
    if next(lines, None) is not None:
        raise invalid("the bundle has lines after its digest")
    checked.digest = expected
    return checked


def _decode(decoder: msgspec.json.Decoder[Any], line: bytes, what: str) -> Any:
    try:
        return decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise invalid(f"{what}: not the line the bundle's format has there ({exc})") from None


def import_bundle(registry: Registry, source: str | os.PathLike[str] | Callable[[], IO[bytes]], *,
                  new_ids: bool = False, under: str | None = None, progress: Progress | None = None) -> Imported:
    """Import the bundle file at ``source`` (or that ``source()`` opens: it is read twice, checked
    whole, then written) into ``registry``'s store, a single server or a cluster.

    ``new_ids``: every session gets a new id (``Imported.ids``; each record keeps its bundle id,
    field ``importedfrom``); else each keeps its own. ``under``: the root becomes a child of that
    session, whose first events must be the bundle's base (its seed is then a reference to them).

    Nothing is written unless the whole file is a bundle whose digest holds (``INVALID_BUNDLE``),
    every id it takes is free (``SESSION_ALREADY_EXISTS``) and ``under`` exists and starts with the
    base (``SESSION_NOT_FOUND``, ``INVALID_BUNDLE``). A bundle imported before is a no-op (by its
    digest: ``written`` 0); an import killed midway resumes, with the same ids, when run again.
    The file must not change between the two reads (it is checked whole before the second).
    """
    redis = registry.redis
    open_bundle: Callable[[], IO[bytes]] = source if callable(source) else functools.partial(_open, source)
    parent = None if under is None else rules.check_id(under)
    compare = None
    if parent is not None:
        if not registry.exists(parent):
            raise errors.not_found(parent)
        compare = _base_comparer(registry, parent)
    with open_bundle() as stream:
        checked = check_bundle(stream, max_event_bytes=registry.state.max_event_bytes, compare_base=compare)
    manifest = checked.manifest
    if parent is not None and registry.length(parent) < manifest.base:
        raise invalid(f"session {rules.echo(parent)} has fewer events than the bundle's base ({manifest.base})")
    mark = keys.bundle_import(checked.digest)
    state, stored_ids, stored_under = redis.hmget(mark, ["state", "ids", "under"])
    first_under = wire.text(stored_under or b"")
    if state is not None and first_under != (parent or ""):
        was = f"under {rules.echo(first_under)}" if first_under else "with no parent"
        raise invalid(f"this bundle was imported {was} before, not under {rules.echo(parent) if parent else 'none'}")
    if stored_ids is not None:
        ids: dict[str, str] = msgspec.json.decode(stored_ids)
        if state == b"started" and new_ids == all(k == v for k, v in ids.items()):
            kept = "--new-ids" if new_ids else "--keep-ids"
            raise invalid(f"an import of this bundle with other ids is under way: run it again without {kept}")
    else:
        ids = {sid: registry.state.new_id() if new_ids else sid for sid in manifest.sessions}
    done = Imported(digest=checked.digest, ids=ids, sessions=len(ids), events=manifest.events, written=0)
    if state == b"done":
        return done
    _check_free(registry, checked.digest, [ids[s] for s in manifest.sessions])
    if state is None:
        redis.hset(mark, mapping={"state": "started", "ids": _line.encode(ids), "under": parent or ""})
    with open_bundle() as stream:
        done.written = _write(registry, stream, checked, ids, parent, progress)
    redis.hset(mark, "state", "done")
    return done


def _open(path: str | os.PathLike[str]) -> IO[bytes]:
    return open(path, "rb")


def _base_comparer(registry: Registry, parent: str) -> Callable[[int, list[bytes]], None]:
    def compare(first: int, lines: list[bytes]) -> None:
        have = registry.events(parent, first, first + len(lines))
        if [wire.encode_event(e) + b"\n" for e in have] != lines:
            raise invalid(f"session {rules.echo(parent)}'s events {first}..{first + len(lines) - 1} are not the "
                          "bundle's base")
    return compare


def _check_free(registry: Registry, digest: str, targets: list[str]) -> None:
    """``SESSION_ALREADY_EXISTS`` for the first of ``targets`` that is taken, but by this bundle's
    import (a resumed one): one pipelined round trip."""
    pipe = registry.redis.pipeline(transaction=False)
    for sid in targets:
        pipe.exists(keys.session(sid))
        pipe.hget(keys.session(sid), "imported")
    replies = pipe.execute()
    for i, sid in enumerate(targets):
        if replies[2 * i] and replies[2 * i + 1] != digest.encode():
            raise errors.already_exists(sid)


def _write(registry: Registry, source: IO[bytes], checked: _Checked, ids: dict[str, str], under: str | None,
           progress: Progress | None) -> int:
    """Write each session not written yet, parents first, each one's record last; the sessions written."""
    redis, state = registry.redis, registry.state
    scripts = lua.Scripts(redis, SCRIPTS)
    manifest = checked.manifest
    lines = iter(source)
    next(lines)  # the manifest
    root_id = ids[manifest.root]
    inline = under is None and manifest.base > 0  # the root's log holds its seed: its ancestors are not here
    root_done = _written(redis, root_id, checked.digest)
    seq = 0
    if manifest.base:
        next(lines)  # the base's line
        base = (next(lines) for _ in range(manifest.base))
        if inline and not root_done:
            redis.delete(keys.session_log(root_id), keys.session_turns(root_id), keys.session_merges(root_id))
            seq = _push(redis, root_id, base, 0, True, progress, manifest.events)
        else:
            for _ in base:
                pass
    written = 0
    for i, sid in enumerate(manifest.sessions):
        entry = _entry.decode(next(lines)).one()
        new = ids[sid]
        events = (next(lines) for _ in range(entry.events))
        root = i == 0
        if root_done if root else _written(redis, new, checked.digest):  # by the run this one resumes
            for _ in events:
                pass
            continue
        if not (root and inline):
            redis.delete(keys.session_log(new), keys.session_turns(new), keys.session_merges(new))
            seq = entry.seed_length if isinstance(entry, Tombstone) else _seed_length(entry.header)
        _push(redis, new, events, seq, isinstance(entry, Entry), progress, manifest.events)
        if isinstance(entry, Tombstone):
            for at in range(0, len(entry.turns), PAGE):
                redis.rpush(keys.session_turns(new), *entry.turns[at:at + PAGE])
        if isinstance(entry.last_end, UnsetType):  # a record without a turn index keeps none
            redis.delete(keys.session_turns(new))
        if isinstance(entry, Entry) and entry.merges:
            redis.hset(keys.session_merges(new), mapping={_ids_in(k, ids): _ids_in(v, ids) for k, v in entry.merges})
        owner = under if root else ids[_parent_of(entry)]
        if owner is not None:
            redis.sadd(keys.session_children(owner), new)
            if not isinstance(entry.need, UnsetType) and not root:
                redis.zadd(keys.session_needs(owner), {new: entry.need})
        if isinstance(entry, Entry):
            if not isinstance(entry.disposed_at, UnsetType):
                redis.zadd(keys.DISPOSED_INDEX, {new: entry.disposed_at})
            if not isinstance(entry.ended_at, UnsetType):
                redis.zadd(keys.ENDED_INDEX, {new: entry.ended_at})
        fields = _record_fields(registry, entry, ids, under if root else None, manifest.base if root else 0,
                                root and inline, sid in checked.parents)
        if new != sid:
            fields["importedfrom"] = sid
        status = scripts("restore", record=keys.session(new), digest=checked.digest, fields=records.flat(fields))
        if int(status) == -1:
            raise errors.already_exists(new)
        if isinstance(entry, Entry):
            state.emit(redis, "session/created", new, int(fields["len"]))
        written += 1
    return written


def _written(redis: Any, sid: str, digest: str) -> bool:
    """Whether this bundle's import wrote ``sid`` already; ``SESSION_ALREADY_EXISTS`` when another
    session (or tombstone) took the id since the check."""
    if not redis.exists(keys.session(sid)):
        return False
    if redis.hget(keys.session(sid), "imported") != digest.encode():
        raise errors.already_exists(sid)
    return True


def _push(redis: Any, sid: str, stream: Iterator[bytes], seq: int, index: bool,
          progress: Progress | None, total: int) -> int:
    """Append the event lines of ``stream`` (from ``seq`` on) to ``sid``'s own log and, with
    ``index``, their turn markers to its turn index: a page per round trip; the next seq."""
    for batch in _pages(stream):
        pipe = redis.pipeline(transaction=False)
        stored = [_stored(_any.decode(line)) for line in batch]
        pipe.rpush(keys.session_log(sid), *[raw for raw, _ in stored])
        marks = [2 * (seq + j) + (t == rules.TURN_END) for j, (_, t) in enumerate(stored)
                 if rules.is_marker(t)] if index else []
        if marks:
            pipe.rpush(keys.session_turns(sid), *marks)
        pipe.execute()
        seq += len(batch)
        if progress:
            progress(len(batch), total)
    return seq


def _pages(stream: Iterator[bytes]) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for line in stream:
        batch.append(line)
        if len(batch) == PAGE:
            yield batch
            batch = []
    if batch:
        yield batch


def _stored(value: dict[str, Any] | None) -> tuple[bytes, str]:
    """An event line's value as the log stores it (without ``seq``; a freed position: ``""``) and
    its type (``""`` for a freed position)."""
    if value is None:
        return b"", ""
    body = dict(value)
    body.pop("seq")
    kind, time_ms, data = body.pop("type"), body.pop("time"), body.pop("data", None)
    return _line.encode({"type": kind, "time": time_ms, "data": data, **body}), str(kind)


def _parent_of(entry: Entry | Tombstone) -> str:
    parent = entry.parent if isinstance(entry, Tombstone) else entry.header.parent_session
    assert isinstance(parent, str)
    return parent


def _ids_in(text: str, ids: dict[str, str]) -> str:
    """A merges index field (a JSON array naming a session) with its bundle id mapped; a value, or
    a field whose id keeps its id, as it is."""
    if not text.startswith("["):
        return text
    items = _any.decode(text)
    if not any(isinstance(x, str) and ids.get(x, x) != x for x in items):
        return text
    return wire.text(_line.encode([ids.get(x, x) if isinstance(x, str) else x for x in items]))


def _record_fields(registry: Registry, entry: Entry | Tombstone, ids: dict[str, str], under: str | None,
                   base: int, inline: bool, has_children: bool) -> dict[str, Any]:
    """The record of an imported session (the compact layout, or the old one as the registry writes
    it), its seed as references to its parent's, as a fork writes them."""
    if isinstance(entry, Tombstone):
        parent = ids[_parent_of(entry)] if isinstance(entry.parent, str) else None
        kept = _seed(registry, parent, entry.seed_length, entry.kept_from, ids[entry.id], True)
        fields: dict[str, Any] = {"deleted": entry.deleted, "seed": _line.encode(kept),
                                  "seedlen": entry.seed_length}
        for name, value in (("parent", parent), ("keptfrom", entry.kept_from), ("freed", entry.freed),
                            ("lastend", entry.last_end), ("seedend", entry.seed_end)):
            if value is not None and not isinstance(value, UnsetType):
                fields[name] = value
        if entry.summary is not UNSET:
            fields["summary"] = _line.encode(entry.summary)
        return fields
    header = entry.header
    new = ids[header.id]
    if under is not None:  # a plain child of ``under``: its seed is under's first events
        header = msgspec.structs.replace(header, id=new, parent_session=under, seed_length=base, kept_from=UNSET)
    elif header.parent_session is not UNSET and header.parent_session in ids:
        header = msgspec.structs.replace(header, id=new, parent_session=ids[header.parent_session])
    else:
        header = msgspec.structs.replace(header, id=new)
    seed_length = _seed_length(header)
    length = seed_length + entry.events
    seed: Segments = ()
    if inline:
        stored_seed_length = 0
    else:
        parent = header.parent_session if isinstance(header.parent_session, str) else None
        seed = _seed(registry, parent, seed_length, header.kept_from, new, has_children or under is not None)
        stored_seed_length = seed_length
    fields = dict(records.header_fields(header, compact=registry.state.compact_records))
    fields.update({"len": length, "seed": _line.encode(seed), "last": entry.last})
    if stored_seed_length != length:
        fields["seedlen"] = stored_seed_length
    if entry.state != "disposed":
        fields["instance"] = registry.state.new_token()
    if not isinstance(entry.merged_into, UnsetType):
        m = entry.merged_into
        fields["mergedinto"] = _line.encode([ids.get(m.session, m.session), m.seq, m.request_id])
    if not isinstance(entry.abandoned_by, UnsetType):
        fields["abandoned"] = entry.abandoned_by
    if not isinstance(entry.edits, UnsetType):
        fields["edits"] = entry.edits
    if entry.summary is not UNSET and under is None:
        fields["summary"] = _line.encode(entry.summary)
    if not isinstance(entry.last_end, UnsetType):
        fields["lastend"] = entry.last_end
        if not isinstance(entry.seed_end, UnsetType) and entry.seed_end != entry.last_end:
            fields["seedend"] = entry.seed_end
    return fields


def _seed(registry: Registry, parent: str | None, seed_length: int, kept_from: int | UnsetType, sid: str,
          by_value: bool) -> Segments:
    """The seed of ``sid``: the first ``seed_length`` events of ``parent`` (a summary child's: its
    summary, then ``parent``'s events from ``kept_from``), by value (resolved: a session others
    reference) or as at most two references and a slice of ``parent``'s own log, as a fork writes."""
    if parent is None or seed_length == 0:
        return ()
    summary = not isinstance(kept_from, UnsetType)
    lo = 0 if isinstance(kept_from, UnsetType) else kept_from
    hi = lo + seed_length - (1 if summary else 0)
    p_seed, p_seedlen = _parent_seed(registry, parent)
    if by_value:
        lineage = (*p_seed, (parent, 0, max(0, hi - p_seedlen)))
        out = window(lineage, lo, hi)
    else:
        out = []
        if lo < p_seedlen:
            out.append((parent, -min(hi, p_seedlen), -lo))
        if hi > p_seedlen:
            out.append((parent, max(lo, p_seedlen) - p_seedlen, hi - p_seedlen))
    return ((f"{SUMMARY_MARK}{sid}", 0, 1), *out) if summary else tuple(out)


def _parent_seed(registry: Registry, parent: str) -> tuple[Segments, int]:
    seed, seedlen, length = registry.redis.hmget(keys.session(parent), ["seed", "seedlen", "len"])
    if seed is None:
        raise errors.not_found(parent)
    stored = int(seedlen if seedlen is not None else length or 0)
    return registry.resolve(parent, decode_segments(seed)), stored
