"""JSONL persistence: a backend that mirrors every session of the registry into one file each.

Layout: ``<root>/<directory(cwd)>/<segment(id)>.jsonl``, the paths of the original harness. A file
holds the header line ``{"type":"session", ...header}`` then one event per line, ``seq`` 0, 1, ...
with no gap; a forked child's file holds its whole log, inherited seed first.

``JsonlBackend`` consumes the lifecycle stream (``keys.LIFECYCLE_STREAM``) in a consumer group,
at least once: every entry, whatever its type, means "bring this session's file up to the
registry's current length", so a redelivered or reordered entry is harmless. An entry is acked
only once the file is durable (fsync of the file, and of its directories when the file was new);
then the session's record learns how many events the file holds (``Registry.mark_persisted``), so
a deletion that waits for the backend can proceed. ``session/deleted`` appends the last line
``{"type":"session/deleted","time":<ms>}`` to an existing file (never creating one); a file ending
with it is never written again.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from redis.exceptions import ResponseError

from ..core import errors, keys, records, rules, wire
from ..core.errors import ForkError
from ..core.registry import Registry
from . import jsonl

log = logging.getLogger("sessionfork.ops.persist")

KINDS = frozenset({"session/created", "session/flush", "session/disposed", "session/deleted"})
_CACHE_MAX = 4096


class JsonlBackend:
    """Mirror sessions into JSONL files from the lifecycle stream, as consumer ``consumer`` of ``group``.

    One consumer per process; several may share a group and a root (files are ``flock``-ed while
    written: POSIX only). Pending entries idle for ``claim_idle_ms`` (a dead consumer's) are reclaimed at
    start and every ``claim_idle_ms``. Redis errors propagate: restart and nothing is lost.
    """

    def __init__(self, registry: Registry, root: Path, *, group: str = "persist", consumer: str,
                 claim_idle_ms: int = 30000, block_ms: int = 1000, batch: int = 100) -> None:
        self.registry = registry
        self.root = Path(root)
        self.group = group
        self.consumer = consumer
        self.claim_idle_ms = claim_idle_ms
        self.block_ms = block_ms
        self.batch = batch
        self._redis: Any = registry.redis  # redis-py's stream replies are typed as Any anyway
        self._started = False
        self._pending_cursor: str | None = "0"  # own pending entries first, from a previous run
        self._claim_cursor: str | None = None
        self._next_claim = 0.0
        # sid -> (file size, next seq, header line) as last written: a file of that size with that
        # header line needs no rescan.
        self._cache: OrderedDict[str, tuple[int, int, bytes]] = OrderedDict()

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, max_entries: int | None = None) -> int:
        """Handle entries until ``stop`` is set or ``max_entries`` were handled; returns how many."""
        total = 0
        while not (stop is not None and stop.is_set()) and (max_entries is None or total < max_entries):
            limit = self.batch if max_entries is None else min(self.batch, max_entries - total)
            total += self._step(limit)
        return total

    def step(self) -> int:
        """Handle one batch (blocking up to ``block_ms`` when there is none); returns entries acked.

        Order: a due reclaim pass (XAUTOCLAIM), then this consumer's own pending entries (left by
        a previous run under the same name), then new entries.
        """
        return self._step(self.batch)

    def _step(self, limit: int) -> int:
        try:
            if not self._started:
                self._create_group()
            if self._claim_cursor is not None or time.monotonic() >= self._next_claim:
                claimed = self._autoclaim(limit)
                if claimed:
                    return self._handle(claimed)
            if self._pending_cursor is not None:
                entries = self._read(self._pending_cursor, limit, None)
                if entries:
                    self._pending_cursor = wire.text(entries[-1][0])
                    return self._handle(entries)
                self._pending_cursor = None
            return self._handle(self._read(">", limit, self.block_ms))
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream or the group vanished (a server restarted empty): create them again.
            log.warning("consumer group %r missing, creating it again", self.group)
            self._started = False
            return 0

    def _create_group(self) -> None:
        try:
            # From "0": a new group persists the stream's whole history, not only what comes next.
            self._redis.xgroup_create(keys.LIFECYCLE_STREAM, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._started = True

    def _read(self, start: str, limit: int, block: int | None) -> list[Any]:
        reply = self._redis.xreadgroup(self.group, self.consumer, {keys.LIFECYCLE_STREAM: start},
                                       count=limit, block=block)
        if isinstance(reply, dict):  # RESP3: {stream: [entries]}
            return [entry for (entries,) in reply.values() for entry in entries or []]
        return [entry for _, entries in reply or [] for entry in entries or []]

    def _autoclaim(self, limit: int) -> list[Any]:
        reply = self._redis.xautoclaim(keys.LIFECYCLE_STREAM, self.group, self.consumer, self.claim_idle_ms,
                                       start_id=self._claim_cursor or "0-0", count=limit)
        cursor = wire.text(reply[0])
        if cursor == "0-0":  # a full pass over the pending entries: the next one in claim_idle_ms
            self._claim_cursor = None
            self._next_claim = time.monotonic() + self.claim_idle_ms / 1000
        else:
            self._claim_cursor = cursor
        trimmed = reply[2] if len(reply) > 2 else []  # Redis 7+: ids it dropped, trimmed from the stream
        if reply[1] or trimmed:
            log.info("reclaimed %d pending entries, dropped %d trimmed ones", len(reply[1]), len(trimmed))
        return list(reply[1])

    # -- entries -------------------------------------------------------------------------------

    def _handle(self, entries: list[Any]) -> int:
        """Sync each session named by ``entries`` once, then ack what is durable or unusable."""
        done: list[Any] = []
        by_session: dict[str, list[Any]] = {}
        disposed: set[str] = set()
        for entry_id, raw_fields in entries:
            if entry_id is None:
                continue  # redis-py's placeholder for a nil entry: nothing to ack
            fields = {wire.text(k): wire.text(v) for k, v in (raw_fields or {}).items()}
            kind, sid = fields.get("type"), fields.get("id", "")
            if kind not in KINDS or not rules.is_valid_id(sid):
                log.warning("skipping entry %s: %r", wire.text(entry_id), fields or "(trimmed from the stream)")
                done.append(entry_id)
                continue
            if kind == jsonl.DELETED_TYPE:
                if not self._mark_deleted(fields.get("header", ""), entry_id):
                    continue  # left pending: retried once idle for claim_idle_ms
                self._cache.pop(sid, None)
                done.append(entry_id)
                continue
            by_session.setdefault(sid, []).append(entry_id)
            if kind == "session/disposed":
                disposed.add(sid)
        files = events = 0
        for sid, ids in by_session.items():
            try:
                written = self.sync(sid)
            except ForkError as exc:
                log.warning("skipping %d entries of %s: %s", len(ids), sid, exc.message)
            except jsonl.ForeignFile as exc:
                log.error("skipping %d entries of %s: %s", len(ids), sid, exc)
            except OSError:
                # Left pending: reclaimed and retried once idle for claim_idle_ms.
                log.exception("cannot write %s; its %d entries stay pending", sid, len(ids))
                self._cache.pop(sid, None)
                continue
            else:
                files += 1 if written else 0
                events += written
            done.extend(ids)
            if sid in disposed:
                self._cache.pop(sid, None)  # a disposed session never grows again
        if done:
            self._redis.xack(keys.LIFECYCLE_STREAM, self.group, *done)
        if entries:
            log.info("handled %d entries (%d acked): %d events written to %d files",
                     len(entries), len(done), events, files)
        return len(done)

    def _mark_deleted(self, raw_header: str, entry_id: Any) -> bool:
        """End the file of a deleted session with the deleted line; False when it cannot be written."""
        try:
            header = wire.decode_header(raw_header)
        except Exception:
            log.warning("skipping entry %s: session/deleted without a readable header", wire.text(entry_id))
            return True
        path = jsonl.path_for(self.root, header)
        try:
            with open(path, "r+b") as f:  # never O_CREAT: a deleted session's file is not made anew
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                if not jsonl.is_current(f, path):  # its header was rewritten meanwhile: the new file
                    return self._mark_deleted(raw_header, entry_id)
                size = os.fstat(f.fileno()).st_size
                if jsonl.ends_deleted(f, size):
                    return True
                end, _ = jsonl.recover(f, size, jsonl.header_line(header))
                f.truncate(end)
                f.seek(end)
                ms = int(wire.text(entry_id).split("-")[0])
                f.write(wire.encode({"type": jsonl.DELETED_TYPE, "time": ms}) + b"\n")
                f.flush()
                os.fsync(f.fileno())
        except FileNotFoundError:
            return True
        except (OSError, jsonl.ForeignFile):
            log.exception("cannot mark %s deleted", path)
            return False
        return True

    def sync(self, session_id: str) -> int:
        """Make the session's file match the registry up to its current length, durably.

        Writes the header if missing, then the events from the file's next seq, in one write;
        returns how many events were written. A torn or unparsable tail is cut off first. A header
        line without the branch's end the registry now holds (``jsonl.STATE_KEYS``) is rewritten
        first (``jsonl.rewrite_header``). Raises ``ForkError`` (session not found),
        ``jsonl.ForeignFile``, ``OSError``.
        """
        header, length, state = self._record(session_id)
        path = jsonl.path_for(self.root, header)
        first = jsonl.header_line(header, state)
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:
                    raise
                path = jsonl.path_for(self.root, header, hashed=True)  # this file system allows shorter names
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            with open(fd, "r+b") as f:
                # Another consumer of the group may hold an entry of the same session right now.
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                if not jsonl.is_current(f, path):
                    continue  # its header was rewritten meanwhile: the new file is at the path
                written = self._write(f, path, session_id, first, length)
            if written is not None:
                return written

    def _record(self, session_id: str) -> tuple[wire.Header, int, wire.SessionState]:
        """The session's header, length and state, in one read (``SESSION_NOT_FOUND`` once deleted)."""
        sid = rules.check_id(session_id)
        raw, cwd, parent, length, *fields = self._redis.hmget(
            keys.session(sid), [*records.HEADER_FIELDS, "len", *records.STATE_FIELDS])
        state = records.decode_state(sid, raw, *fields)
        if raw is None or state is None or state.state == "deleted":
            raise errors.not_found(sid)
        return records.decode_header(sid, raw, cwd, parent), 0 if length is None else int(length), state

    def _write(self, f: Any, path: Path, session_id: str, first: bytes, length: int) -> int | None:
        """``sync``'s write into the open, locked file: how many events, or ``None`` when its header
        was rewritten (the caller opens the new file)."""
        size = os.fstat(f.fileno()).st_size
        if jsonl.ends_deleted(f, size):
            return 0  # deleted meanwhile (a later id cannot be this one: ids are never reused)
        cached = self._cache.get(session_id)
        if cached is not None and cached[0] == size and cached[2] == first:
            end, next_seq = size, cached[1]
        else:
            end, next_seq = jsonl.recover(f, size, first)
            if end < size:
                log.warning("%s: cut off %d bytes of a torn or unparsable tail", path, size - end)
                f.truncate(end)
            if next_seq >= 0 and jsonl.first_line(f) != first:
                jsonl.rewrite_header(path, f, end, first)  # the branch ended since the file was made
                self._cache.pop(session_id, None)
                return None
        start = max(next_seq, 0)
        if start > length:  # Redis lost data, or this root belongs to another registry
            log.warning("%s holds %d events, more than the registry's %d", path, start, length)
        try:
            new = self.registry.events(session_id, start, length) if start < length else []
        except ForkError:
            if size == 0:  # deleted between the header read and the open: make no file for it
                path.unlink(missing_ok=True)
            raise
        assert not new or new[0].seq == start, "the registry skipped or repeated a seq"
        data = (first if next_seq < 0 else b"") + b"".join(wire.encode_event(e) + b"\n" for e in new)
        if data or end < size:
            f.seek(end)
            f.write(data)  # one write: the batch lands whole or as one torn tail, cut next time
            f.flush()
            os.fsync(f.fileno())
        new_size = end + len(data)
        if next_seq < 0:
            # A new file: its name, and its directories' (maybe made just now), must survive a crash too.
            for made in (path.parent, self.root, self.root.parent):
                jsonl.fsync_dir(made)
        self.registry.mark_persisted(session_id, start + len(new))
        self._cache[session_id] = (new_size, start + len(new), first)
        self._cache.move_to_end(session_id)
        if len(self._cache) > _CACHE_MAX:
            self._cache.popitem(last=False)
        return len(new)
