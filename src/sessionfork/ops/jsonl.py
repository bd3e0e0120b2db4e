"""The original harness's JSONL files: where a session's file lives and how a file is read back.

Layout: ``<root>/<directory(cwd)>/<segment(id)>.jsonl``. A file holds the header line
``{"type":"session", ...header}`` then one event per line, ``seq`` 0, 1, ... with no gap, and, once
the session is deleted, the last line ``{"type":"session/deleted","time":<ms>}``. A torn last line
(a crash mid-write) is cut off on recovery, never parsed as an event.

A branch that ended has its end in the header line: ``"mergedInto": {"session", "seq",
"requestId"}`` (its latest merge into an ancestor) and ``"abandonedBy": <request id>`` (the select
that abandoned it), each only when the session has it (``STATE_KEYS``). A session ends after its
file was made, so line 1 changes then: the file is rewritten whole, under another name, and renamed
over the old one (``rewrite_header``: a crash leaves the old file or the new one, never a mix); a
writer holding the old file's lock opens the path again (``is_current``).
"""

from __future__ import annotations

import hashlib
import os
import string
from pathlib import Path
from typing import IO, Any

import msgspec

from ..core import wire
from ..core.wire import Header, SessionState

NO_CWD_DIR = "_no-cwd"
DELETED_TYPE = "session/deleted"
_SAFE = frozenset(string.ascii_letters + string.digits + "._-")
_CHUNK = 64 * 1024
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


STATE_KEYS = ("mergedInto", "abandonedBy")
"""Header-line keys a session gains when its branch ends (after its file was made)."""


def header_line(header: Header, state: SessionState | None = None) -> bytes:
    """The first line of a file: ``{"type":"session", ...}`` (type first, optional keys absent),
    then ``state``'s ``mergedInto`` and ``abandonedBy`` when it has them (``STATE_KEYS``)."""
    line = {"type": "session", **msgspec.to_builtins(header)}
    if state is not None:
        line.update((k, v) for k, v in msgspec.to_builtins(state).items() if k in STATE_KEYS)
    return wire.encode(line) + b"\n"


def same_session(found: Any, expected: Any) -> bool:
    """Header line ``found`` is ``expected``'s session: equal but for ``STATE_KEYS``."""
    if not isinstance(found, dict) or not isinstance(expected, dict):
        return False
    return {k: v for k, v in found.items() if k not in STATE_KEYS} == \
        {k: v for k, v in expected.items() if k not in STATE_KEYS}


def first_line(f: IO[bytes]) -> bytes:
    """Line 1 of the file, its newline included."""
    f.seek(0)
    return f.readline()


def is_current(f: IO[bytes], path: Path) -> bool:
    """``f`` is still the file at ``path`` (not one ``rewrite_header`` renamed another over)."""
    try:
        return os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def rewrite_header(path: Path, f: IO[bytes], end: int, first: bytes) -> None:
    """Make ``first`` line 1 of the file at ``path`` (open as ``f``, its lock held, its good part
    ending at ``end``): a copy with the new line 1 and the same lines after it, made durable, then
    renamed over ``path``. Every writer, this one too, must open ``path`` again (``is_current``)."""
    old = first_line(f)
    tmp = path.parent / f"{hashlib.sha256(path.name.encode('utf-8', 'surrogatepass')).hexdigest()}.tmp"
    with open(tmp, "wb") as out:  # never a session's name: those end with .jsonl
        out.write(first)
        f.seek(len(old))
        left = end - len(old)
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class ForeignFile(Exception):
    """The file at a session's path starts with another header: never append to it."""


def recover(f: IO[bytes], size: int, first: bytes) -> tuple[int, int]:
    """(end of the last good line, next seq); next seq -1 means the file needs its header.

    Cuts back line by line while the last line is incomplete or does not parse, so a torn write
    is never read as an event. Raises ``ForeignFile`` unless line 1 is ``first``'s session (as
    JSON, ``same_session``: its ``STATE_KEYS`` may differ).
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
            if not same_session(found, expected):
                raise ForeignFile(f"line 1 is {found!r:.200}, not this session's header")
            return nl + 1, 0 if prev < 0 else value["seq"] + 1
        end = prev + 1
    return 0, -1


def ends_deleted(f: IO[bytes], size: int) -> bool:
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


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
