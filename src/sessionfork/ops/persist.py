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
import hashlib
import logging
import os
import string
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

import msgspec
from redis.exceptions import ResponseError

from ..core import keys, rules, wire
from ..core.errors import ForkError
from ..core.registry import Registry
from ..core.wire import Header

log = logging.getLogger("sessionfork.ops.persist")

NO_CWD_DIR = "_no-cwd"
KINDS = frozenset({"session/created", "session/flush", "session/disposed", "session/deleted"})
DELETED_TYPE = "session/deleted"
_SAFE = frozenset(string.ascii_letters + string.digits + "._-")
_CHUNK = 64 * 1024
_CACHE_MAX = 4096
SUFFIX = ".jsonl"
MAX_SEGMENT = 255 - len(SUFFIX)  # the longest file name most file systems allow, in bytes
HASHED_PREFIX = 64  # a hashed name is at most 64 + 2 + 64 + 6 = 136 bytes: fits even eCryptfs (143)


def segment(session_id: str) -> str:
    """``session_id`` as one safe path segment of ``[A-Za-z0-9._~-]``, at most ``MAX_SEGMENT`` bytes.

    ``[A-Za-z0-9._-]`` stay; every other UTF-16 code unit, ``~`` included, becomes ``~XXXX``
    (upper-case hex); ``.`` and ``..`` alone are escaped whole: reversible. An encoded id longer
    than ``MAX_SEGMENT`` (a file name is at most 255 bytes; ``~003A`` per ``:``) becomes its first
    ``HASHED_PREFIX`` characters (cut before an escape), ``~~`` and the 64 hex digits of
    sha256(id UTF-8): never an encoded name (those have no ``~~``), distinct per id. Raises
    ``ValueError`` on ``""``.
    """
    if not session_id:
        raise ValueError("an empty session id has no path segment")
    if session_id in (".", ".."):
        return "~002E" * len(session_id)
    # UTF-16 code units, not code points: an astral character is two escapes, as in the harness.
    raw = session_id.encode("utf-16-be", "surrogatepass")
    units = (int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2))
    encoded = "".join(chr(u) if chr(u) in _SAFE else f"~{u:04X}" for u in units)
    return encoded if len(encoded) <= MAX_SEGMENT else hashed_segment(session_id, encoded)


def hashed_segment(session_id: str, encoded: str | None = None) -> str:
    """The hashed form of ``segment(session_id)`` (see there): also used when the file system
    refuses the encoded name as too long (some allow less than 255 bytes)."""
    encoded = encoded or segment(session_id)
    if "~~" in encoded:
        return encoded
    cut = encoded[:HASHED_PREFIX]
    escape = cut.rfind("~")
    if escape > HASHED_PREFIX - 5:  # do not split an escape
        cut = cut[:escape]
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{cut}~~{digest}"


def directory(cwd: str | None) -> str:
    """The directory of a session: ``_no-cwd``, or ``cwd-`` + 12 hex digits of sha256(cwd UTF-8)."""
    if cwd is None:
        return NO_CWD_DIR
    return "cwd-" + hashlib.sha256(cwd.encode("utf-8")).hexdigest()[:12]


def path_for(root: Path, header: Header, *, hashed: bool = False) -> Path:
    """Where the session of ``header`` is persisted under ``root`` (``hashed``: under its hashed
    name, where a file system refuses the encoded one as too long)."""
    cwd = header.cwd if isinstance(header.cwd, str) else None
    name = hashed_segment(header.id) if hashed else segment(header.id)
    return root / directory(cwd) / f"{name}{SUFFIX}"


def header_line(header: Header) -> bytes:
    """The first line of a file: ``{"type":"session", ...}`` (type first, optional keys absent)."""
    return wire.encode({"type": "session", **msgspec.to_builtins(header)}) + b"\n"


class ForeignFile(Exception):
    """The file at a session's path starts with another header: never append to it."""


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
        # sid -> (file size, next seq) as last written: a file of that size needs no rescan.
        self._cache: OrderedDict[str, tuple[int, int]] = OrderedDict()

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
            if kind == DELETED_TYPE:
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
            except ForeignFile as exc:
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
        path = path_for(self.root, header)
        try:
            with open(path, "r+b") as f:  # never O_CREAT: a deleted session's file is not made anew
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                size = os.fstat(f.fileno()).st_size
                if _ends_deleted(f, size):
                    return True
                end, _ = _recover(f, size, header_line(header))
                f.truncate(end)
                f.seek(end)
                ms = int(wire.text(entry_id).split("-")[0])
                f.write(wire.encode({"type": DELETED_TYPE, "time": ms}) + b"\n")
                f.flush()
                os.fsync(f.fileno())
        except FileNotFoundError:
            return True
        except (OSError, ForeignFile):
            log.exception("cannot mark %s deleted", path)
            return False
        return True

    def sync(self, session_id: str) -> int:
        """Make the session's file match the registry up to its current length, durably.

        Writes the header if missing, then the events from the file's next seq, in one write;
        returns how many events were written. A torn or unparsable tail is cut off first. Raises
        ``ForkError`` (session not found), ``ForeignFile``, ``OSError``.
        """
        header = self.registry.header(session_id)
        length = self.registry.length(session_id)
        path = path_for(self.root, header)
        first = header_line(header)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            path = path_for(self.root, header, hashed=True)  # this file system allows shorter names
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        with open(fd, "r+b") as f:
            # Another consumer of the group may hold an entry of the same session right now.
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            size = os.fstat(f.fileno()).st_size
            if _ends_deleted(f, size):
                return 0  # deleted meanwhile (a later id cannot be this one: ids are never reused)
            cached = self._cache.get(session_id)
            if cached is not None and cached[0] == size:
                end, next_seq = size, cached[1]
            else:
                end, next_seq = _recover(f, size, first)
                if end < size:
                    log.warning("%s: cut off %d bytes of a torn or unparsable tail", path, size - end)
                    f.truncate(end)
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
                _fsync_dir(made)
        self.registry.mark_persisted(session_id, start + len(new))
        self._cache[session_id] = (new_size, start + len(new))
        self._cache.move_to_end(session_id)
        if len(self._cache) > _CACHE_MAX:
            self._cache.popitem(last=False)
        return len(new)


# -- file recovery -------------------------------------------------------------------------------


def _recover(f: IO[bytes], size: int, first: bytes) -> tuple[int, int]:
    """(end of the last good line, next seq); next seq -1 means the file needs its header.

    Cuts back line by line while the last line is incomplete or does not parse, so a torn write
    is never read as an event. Raises ``ForeignFile`` unless line 1 is ``first`` (as JSON).
    """
    expected = msgspec.json.decode(first)
    end = size
    while (nl := _rfind_newline(f, end)) >= 0:
        prev = _rfind_newline(f, nl)
        f.seek(prev + 1)
        value = _decode(f.read(nl - prev - 1))
        if prev < 0 and value is None:
            break  # a torn header line alone: write it again
        if prev < 0 or (isinstance(value, dict) and type(value.get("seq")) is int):
            f.seek(0)
            found = value if prev < 0 else _decode(f.readline())
            if found != expected:
                raise ForeignFile(f"line 1 is {found!r:.200}, not this session's header")
            return nl + 1, 0 if prev < 0 else value["seq"] + 1
        end = prev + 1
    return 0, -1


def _ends_deleted(f: IO[bytes], size: int) -> bool:
    """The file's last line is the ``session/deleted`` line."""
    nl = _rfind_newline(f, size)
    if nl < 0 or nl != size - 1:
        return False
    f.seek(_rfind_newline(f, nl) + 1)
    value = _decode(f.read(nl - f.tell()))
    return isinstance(value, dict) and value.get("type") == DELETED_TYPE


def _rfind_newline(f: IO[bytes], before: int) -> int:
    """Offset of the last ``\\n`` before offset ``before``, or -1; reads backwards in chunks."""
    pos = before
    while pos > 0:
        start = max(0, pos - _CHUNK)
        f.seek(start)
        found = f.read(pos - start).rfind(b"\n")
        if found >= 0:
            return start + found
        pos = start
    return -1


def _decode(line: bytes) -> Any:
    try:
        return msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):  # unreadable: cut off and written again
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
