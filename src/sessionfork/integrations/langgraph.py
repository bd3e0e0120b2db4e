"""LangGraph's checkpointer over the session registry: ``SessionforkSaver`` (extra ``langgraph``).

One LangGraph thread is one session. Its pointer (``keys.langgraph_thread``) names the session; the
session's log holds the thread's history as events, append-only:

* ``langgraph/checkpoint``: one ``put``: ``{"ns", "id", "parent", "checkpoint", "metadata",
  "blobs"}``: the checkpoint's namespace and id, its parent's id (``None`` for none), the
  checkpoint without its channel values and its metadata (each ``[type, base64]`` of the saver's
  ``serde``), and the values of the channels ``new_versions`` names (``[channel, version, type,
  base64]`` each); a checkpoint's values are those of its ``channel_versions``, read from the newest
  event that stored each (namespace, channel, version);
* ``langgraph/writes``: one ``put_writes``: ``{"ns", "id", "task", "path", "writes"}`` with
  ``[idx, channel, type, base64]`` per write; a regular write (``idx >= 0``) already stored for
  its (task, idx) is kept, a special one (``ERROR``, ``INTERRUPT``, ...: negative) replaced.

Every other event (a merge's ``turn/start``, ``session/merge`` and ``turn/end``) is ignored, and a
merged branch's checkpoints count as the parent thread's own. Events never change once appended, so
each saver keeps what it has read of a session and reads only the events appended since.

``copy_thread`` forks the session (by reference: the cost does not grow with the thread's length);
``delete_thread`` and ``prune(strategy="delete")`` delete it; ``prune(strategy="keep_latest")`` and
``delete_for_runs`` write the thread's kept checkpoints (with their writes and the values they read)
into a new session, move the pointer to it, then dispose the old session, copy across what was
appended to it meanwhile, and delete it: under the registry's lineage rules a copy of the thread
keeps every event it had.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core import errors, keys, lua
from ..core.errors import ErrorCode, ForkError
from ..core.forks import fork
from ..core.merge_steps import Merged
from ..core.merges import merge
from ..core.registry import Registry
from ..core.store import LengthMoved
from ..core.wire import Event, NewEvent

__all__ = ["CHECKPOINT_EVENT", "MERGE_MARK", "STRATEGIES", "WRITES_EVENT", "SessionforkSaver"]

CHECKPOINT_EVENT = "langgraph/checkpoint"
"""The type of the event one ``put`` appends."""
WRITES_EVENT = "langgraph/writes"
"""The type of the event one ``put_writes`` appends."""
MERGE_MARK = "turn/end"
"""The type of the event ``merge_thread`` appends to the thread merged into, closing its history so
far as a completed turn (data ``{"reason": {"kind": "langgraph/merge"}}``) when it ends otherwise."""
STRATEGIES = ("keep_latest", "delete")
"""The strategies of ``prune``."""
_CHUNK = 256
"""Events per append call when a thread is rewritten."""
_ATTEMPTS = 16
"""How often one call re-reads a thread's pointer that moved under it before giving up."""
_CACHED = 1024
"""Sessions whose folded log a saver keeps (least recently read dropped first)."""
_MOVED = (ErrorCode.SESSION_NOT_FOUND, ErrorCode.SESSION_NOT_LIVE)
_PACKAGE = __name__.rpartition(".")[0]
SCRIPTS = lua.table(lua.Spec("swap", ("pointer",), ("held", "moved"), _PACKAGE))
"""The saver's one script: ``swap`` moves a thread's pointer only if it still names the session it held."""

Typed = tuple[str, bytes]


def _pack(typed: Typed) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode("ascii")]


def _unpack(pair: Sequence[str]) -> Typed:
    return (pair[0], base64.b64decode(pair[1]))


def _text(raw: Any) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass
class _Log:
    """A session's checkpoints, writes and channel values, folded from its first ``length`` events."""

    length: int = 0
    checkpoints: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """namespace -> checkpoint id -> its event's data."""
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, list[str], str]]] = field(default_factory=dict)
    """(namespace, checkpoint id) -> (task id, idx) -> (task id, channel, value, task path)."""
    blobs: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    """(namespace, channel, version) -> value."""
    newest: dict[str, str] = field(default_factory=dict)
    """namespace -> its greatest checkpoint id (a session's checkpoints are only ever added)."""

    def fold(self, events: Sequence[Event]) -> None:
        for event in events:
            if event.seq < self.length:
                continue
            data = event.data
            if event.type == CHECKPOINT_EVENT:
                ns = data["ns"]
                self.checkpoints.setdefault(ns, {})[data["id"]] = data
                if data["id"] > self.newest.get(ns, ""):
                    self.newest[ns] = data["id"]
                for channel, version, kind, value in data["blobs"]:
                    self.blobs[(ns, channel, str(version))] = [kind, value]
            elif event.type == WRITES_EVENT:
                stored = self.writes.setdefault((data["ns"], data["id"]), {})
                for idx, channel, kind, value in data["writes"]:
                    key = (data["task"], idx)
                    if idx >= 0 and key in stored:
                        continue
                    stored[key] = (data["task"], channel, [kind, value], data["path"])
            self.length = event.seq + 1

    def row(self, ns: str, data: dict[str, Any], versions: ChannelVersions) -> _Row:
        values = {ch: self.blobs[(ns, ch, str(v))] for ch, v in versions.items() if (ns, ch, str(v)) in self.blobs}
        stored = self.writes.get((ns, data["id"]), {})
        ordered = sorted(stored.items(), key=lambda item: writes_sort_key(item[1][3], *item[0]))
        return _Row(ns, data, values, [(task, channel, value) for _key, (task, channel, value, _path) in ordered])


@dataclass(frozen=True)
class _Row:
    """What one checkpoint tuple is built from, copied out of a ``_Log``."""

    ns: str
    data: dict[str, Any]
    values: dict[str, list[str]]
    writes: list[tuple[str, str, list[str]]]


class SessionforkSaver(BaseCheckpointSaver[Any]):
    """A LangGraph checkpointer storing each thread in one session of ``registry``.

    Every method has its ``a``-prefixed async twin (run in a worker thread). Checkpoint namespaces
    of one thread share its session and never mix: each read names its namespace. ``list`` yields
    newest first (descending checkpoint id) within each namespace. Writes are single appends, so
    concurrent writers never leave a checkpoint half-written, and a thread rewritten meanwhile
    (``prune``, ``delete_for_runs``) loses none of them. Values are encoded by ``serde`` (LangGraph's
    ``JsonPlusSerializer`` by default); one event holds at most the registry's ``max_event_bytes``
    (1 MiB by default): a ``put`` whose new channel values exceed it is ``INVALID_REQUEST``, nothing
    written. The saver keeps, in memory, what it read of the 1,024 sessions it read
    last. Errors are ``ForkError``.
    """

    def __init__(self, registry: Registry, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self.registry = registry
        """The registry holding the threads' sessions."""
        self._scripts = lua.Scripts(registry.redis, SCRIPTS)
        self._lock = threading.Lock()
        self._logs: OrderedDict[str, _Log] = OrderedDict()
        self._pointers: dict[str, str] = {}
        self._indexed: set[tuple[str, str]] = set()

    # -- the thread's session ---------------------------------------------------------------------

    def session_of(self, thread_id: str) -> str | None:
        """The id of the session holding ``thread_id``'s checkpoints (``None``: it has none): fork,
        merge or inspect it with sessionfork's own operations."""
        return _text(self.registry.redis.get(keys.langgraph_thread(str(thread_id))))

    def merge_thread(self, branch_thread_id: str, into_thread_id: str) -> Merged:
        """Merge a copy back: the checkpoints and writes ``branch_thread_id`` gained since it was
        copied (``copy_thread``, at any depth) from ``into_thread_id`` join that thread's history
        (a sessionfork merge of mode ``events``: one atomic step, recorded in both sessions'
        lineage). The branch keeps its own. Returns the merge (``Merged``). A thread without a
        session is ``SESSION_NOT_FOUND``; a branch not copied from it, ``NOT_DESCENDANT``; a branch
        with nothing new, or merged before, ``INVALID_REQUEST`` / ``ALREADY_MERGED``.
        """
        branch, into = str(branch_thread_id), str(into_thread_id)
        for _attempt in range(_ATTEMPTS):
            child, parent = self.session_of(branch), self.session_of(into)
            if child is None or parent is None:
                raise ForkError(ErrorCode.SESSION_NOT_FOUND, f'thread "{into if child else branch}" has no checkpoints')
            length, seed = self.registry.length(child), self.registry.header(child).seed_length
            first = seed if isinstance(seed, int) else 0
            if length <= first:
                raise errors.invalid(f'thread "{branch}" has nothing new since it was copied: nothing to merge')
            ends = self.registry.length(parent)
            if ends and self.registry.last_turn_end(parent) != ends - 1:
                try:
                    self.registry.append(parent, [NewEvent(MERGE_MARK, {"reason": {"kind": "langgraph/merge"}})],
                                         expect_length=ends)
                except LengthMoved:
                    continue
            try:
                return merge(self.registry, parent, child, mode="events", range=(first, length - 1),
                             if_child_length=length)
            except ForkError as err:
                if err.code not in (ErrorCode.PRECONDITION_FAILED, ErrorCode.OPEN_TURN):
                    raise
        raise _moved(into, "merge")

    def _writable(self, thread: str) -> str:
        """The thread's session, created (and named by its pointer) when it has none."""
        redis = self.registry.redis
        for _attempt in range(_ATTEMPTS):
            sid = self._pointers.get(thread) or self.session_of(thread)
            if sid is None:
                redis.sadd(keys.LANGGRAPH_THREADS, thread)
                handle = self.registry.create()
                if not redis.set(keys.langgraph_thread(thread), handle.id, nx=True):
                    self._drop(handle.id)
                    continue
                sid = handle.id
            self._pointers[thread] = sid
            return sid
        raise ForkError(ErrorCode.INTERNAL, f'thread "{thread}" got no session in {_ATTEMPTS} attempts')

    def _append(self, thread: str, events: Sequence[NewEvent]) -> None:
        for _attempt in range(_ATTEMPTS):
            sid = self._writable(thread)
            try:
                self.registry.append(sid, events)
                return
            except ForkError as err:
                if err.code not in _MOVED:
                    raise
                self._pointers.pop(thread, None)
        raise _moved(thread, "write")

    def _fold(self, sid: str) -> _Log:
        """The session's log folded up to its end (what this saver read before, and what came since)."""
        with self._lock:
            log = self._logs.get(sid)
            if log is None:
                log = self._logs[sid] = _Log()
                while len(self._logs) > _CACHED:
                    self._logs.popitem(last=False)
            self._logs.move_to_end(sid)
            start = log.length
        tail = self.registry.events(sid, start)
        with self._lock:
            log.fold(tail)
        return log

    def _load(self, thread: str) -> _Log | None:
        """The thread's folded log, ``None`` when it has no session."""
        for _attempt in range(_ATTEMPTS):
            sid = self.session_of(thread)
            if sid is None:
                return None
            try:
                return self._fold(sid)
            except ForkError as err:
                if err.code is not ErrorCode.SESSION_NOT_FOUND:
                    raise
        raise _moved(thread, "read")

    def _drop(self, sid: str) -> None:
        """Delete a session (gone already: nothing to do) and forget its folded log."""
        try:
            self.registry.delete(sid)
        except ForkError as err:
            if err.code is not ErrorCode.SESSION_NOT_FOUND:
                raise
        with self._lock:
            self._logs.pop(sid, None)

    def _index_run(self, thread: str, run: str) -> None:
        if (thread, run) in self._indexed:
            return
        pipe = self.registry.redis.pipeline(transaction=False)
        pipe.sadd(keys.langgraph_run(run), thread)
        pipe.sadd(keys.langgraph_thread_runs(thread), run)
        pipe.execute()
        self._indexed.add((thread, run))

    # -- tuples -----------------------------------------------------------------------------------

    def _tuple(self, thread_id: Any, row: _Row) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed(_unpack(row.data["checkpoint"]))
        values = {ch: self.serde.loads_typed(_unpack(v)) for ch, v in row.values.items() if v[0] != "empty"}
        parent = row.data["parent"]
        return CheckpointTuple(
            config=_config(thread_id, row.ns, row.data["id"]),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self._metadata(row),
            parent_config=_config(thread_id, row.ns, parent) if parent else None,
            pending_writes=[(task, channel, self.serde.loads_typed(_unpack(value)))
                            for task, channel, value in row.writes],
        )

    def _metadata(self, row: _Row) -> CheckpointMetadata:
        metadata: CheckpointMetadata = self.serde.loads_typed(_unpack(row.data["metadata"]))
        return metadata

    def _versions(self, data: dict[str, Any]) -> ChannelVersions:
        versions: ChannelVersions = self.serde.loads_typed(_unpack(data["checkpoint"]))["channel_versions"]
        return versions

    # -- BaseCheckpointSaver ----------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), else its namespace's newest;
        ``None`` when there is none."""
        conf = config["configurable"]
        ns = conf.get("checkpoint_ns", "")
        log = self._load(str(conf["thread_id"]))
        if log is None:
            return None
        with self._lock:
            saved = log.checkpoints.get(ns, {})
            wanted = get_checkpoint_id(config) or log.newest.get(ns)
            data = saved.get(wanted) if wanted else None
        if data is None:
            return None
        versions = self._versions(data)
        with self._lock:
            row = log.row(ns, data, versions)
        return self._tuple(conf["thread_id"], row)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints of ``config``'s thread (every thread when ``None``), newest first within
        each namespace: only ``config``'s namespace when it names one, only its ``checkpoint_id``
        when it names one, only those older than ``before``'s, only those whose metadata holds
        each item of ``filter``, at most ``limit``."""
        conf = config["configurable"] if config else {}
        if config:
            threads: list[Any] = [conf["thread_id"]]
        else:
            threads = sorted(t for t in (_text(m) for m in self.registry.redis.smembers(keys.LANGGRAPH_THREADS)) if t)
        only_ns = conf.get("checkpoint_ns")
        only_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        for thread_id in threads:
            log = self._load(str(thread_id))
            if log is None:
                continue
            with self._lock:
                chosen = [(ns, saved[cid]) for ns, saved in list(log.checkpoints.items())
                          if only_ns is None or ns == only_ns
                          for cid in sorted(saved, reverse=True)
                          if (not only_id or cid == only_id) and (not before_id or cid < before_id)]
            for ns, data in chosen:
                if filter:
                    metadata = self.serde.loads_typed(_unpack(data["metadata"]))
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                if left is not None:
                    if left <= 0:
                        return
                    left -= 1
                versions = self._versions(data)
                with self._lock:
                    row = log.row(ns, data, versions)
                yield self._tuple(thread_id, row)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Append the checkpoint (and the values of the channels in ``new_versions``) to its
        thread's session, in one event; returns the config naming it."""
        conf = config["configurable"]
        thread, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        stored = checkpoint.copy()
        values: dict[str, Any] = stored.pop("channel_values")  # type: ignore[misc]  # a copy's key, put back on read
        blobs = [[ch, version, *_pack(self.serde.dumps_typed(values[ch]) if ch in values else ("empty", b""))]
                 for ch, version in new_versions.items()]
        meta = get_serializable_checkpoint_metadata(config, metadata)
        data: dict[str, Any] = {"ns": ns, "id": checkpoint["id"], "parent": conf.get("checkpoint_id"),
                                "checkpoint": _pack(self.serde.dumps_typed(stored)),
                                "metadata": _pack(self.serde.dumps_typed(meta)), "blobs": blobs}
        run = meta.get("run_id")
        if run is not None:
            data["run"] = str(run)
            self._index_run(thread, str(run))
        self._append(thread, [NewEvent(CHECKPOINT_EVENT, data)])
        return _config(conf["thread_id"], ns, checkpoint["id"])

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Append a task's writes for the checkpoint ``config`` names, in one event."""
        conf = config["configurable"]
        packed = [[WRITES_IDX_MAP.get(ch, idx), ch, *_pack(self.serde.dumps_typed(value))]
                  for idx, (ch, value) in enumerate(writes)]
        data = {"ns": conf.get("checkpoint_ns", ""), "id": conf["checkpoint_id"], "task": task_id,
                "path": task_path, "writes": packed}
        self._append(str(conf["thread_id"]), [NewEvent(WRITES_EVENT, data)])

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's session (its pointer first); a thread without one: nothing to do.
        Copies of it (``copy_thread``) keep every event."""
        thread = str(thread_id)
        redis = self.registry.redis
        for _attempt in range(_ATTEMPTS):
            sid = self.session_of(thread)
            if sid is None:
                break
            if self._scripts("swap", pointer=keys.langgraph_thread(thread), held=sid, moved=""):
                self._drop(sid)
                break
        self._pointers.pop(thread, None)
        runs = [r for r in (_text(m) for m in redis.smembers(keys.langgraph_thread_runs(thread))) if r]
        pipe = redis.pipeline(transaction=False)
        pipe.srem(keys.LANGGRAPH_THREADS, thread)
        for run in runs:
            pipe.srem(keys.langgraph_run(run), thread)
        pipe.delete(keys.langgraph_thread_runs(thread))
        pipe.execute()
        self._indexed = {(t, r) for t, r in self._indexed if t != thread}

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Make ``target_thread_id`` a copy of ``source_thread_id``: a fork of its session (by
        reference: the same cost at any length), every checkpoint, namespace and pending write as
        they are now; later writes to either never show in the other. A source without a session:
        nothing to do. A target that has a session already is ``INVALID_REQUEST``, nothing written."""
        source, target = str(source_thread_id), str(target_thread_id)
        redis = self.registry.redis
        for _attempt in range(_ATTEMPTS):
            sid = self.session_of(source)
            if sid is None:
                return
            if redis.exists(keys.langgraph_thread(target)):
                raise _taken(target)
            try:
                length = self.registry.length(sid)
                child = fork(self.registry, sid, boundary=length - 1) if length else fork(self.registry, sid)
            except ForkError as err:
                if err.code not in _MOVED:
                    raise
                continue
            runs = [r for r in (_text(m) for m in redis.smembers(keys.langgraph_thread_runs(source))) if r]
            pipe = redis.pipeline(transaction=False)
            pipe.sadd(keys.LANGGRAPH_THREADS, target)
            for run in runs:
                pipe.sadd(keys.langgraph_run(run), target)
                pipe.sadd(keys.langgraph_thread_runs(target), run)
            pipe.execute()
            if not redis.set(keys.langgraph_thread(target), child.id, nx=True):
                self._drop(child.id)
                raise _taken(target)
            return
        raise _moved(source, "copy")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep each namespace's newest checkpoint (with its pending writes and
        the values it reads; its parent, when not kept, is dropped from it); ``"delete"``: delete
        the threads. A thread without a session: nothing to do. ``thread_ids`` as one ``str``, or
        another strategy, is ``INVALID_REQUEST``, nothing pruned."""
        if isinstance(thread_ids, str):
            raise errors.invalid("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in STRATEGIES:
            raise errors.invalid(f"unknown prune strategy {strategy!r}: expected keep_latest or delete")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
            else:
                self._rewrite(str(thread_id), _latest)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove every checkpoint whose metadata's ``run_id`` is one of ``run_ids`` (with its
        pending writes), in every thread and namespace; the threads' other checkpoints stay."""
        runs = {str(r) for r in run_ids}
        redis = self.registry.redis
        threads = sorted({t for run in runs for t in (_text(m) for m in redis.smembers(keys.langgraph_run(run))) if t})
        for thread in threads:
            self._rewrite(thread, lambda log: _without(log, runs))
        pipe = redis.pipeline(transaction=False)
        for run in sorted(runs):
            pipe.delete(keys.langgraph_run(run))
            for thread in threads:
                pipe.srem(keys.langgraph_thread_runs(thread), run)
        pipe.execute()
        self._indexed = {(t, r) for t, r in self._indexed if r not in runs}

    def _rewrite(self, thread: str, keep: Callable[[_Log], set[tuple[str, str]]]) -> None:
        """Move the thread to a new session holding only the checkpoints ``keep`` names."""
        pointer = keys.langgraph_thread(thread)
        for _attempt in range(_ATTEMPTS):
            sid = self.session_of(thread)
            if sid is None:
                return
            try:
                log = self._fold(sid)
            except ForkError as err:
                if err.code is not ErrorCode.SESSION_NOT_FOUND:
                    raise
                continue
            with self._lock:
                kept = keep(log)
                if kept == {(ns, cid) for ns, saved in log.checkpoints.items() for cid in saved}:
                    return
                rows = [(ns, saved[cid]) for ns, saved in log.checkpoints.items() for cid in sorted(saved)
                        if (ns, cid) in kept]
            events = self._compacted(log, rows, kept)
            handle = self.registry.create()
            for start in range(0, len(events), _CHUNK):
                self.registry.append(handle, events[start:start + _CHUNK])
            if not self._scripts("swap", pointer=pointer, held=sid, moved=handle.id):
                self._drop(handle.id)
                continue
            self._pointers[thread] = handle.id
            self._seal(sid, log.length, handle.id)
            return
        raise _moved(thread, "prune")

    def _seal(self, sid: str, length: int, successor: str) -> None:
        """End ``sid`` (its pointer moved to ``successor``): what was appended to it after its first
        ``length`` events is copied to ``successor``, then it is deleted."""
        try:
            self.registry.dispose(sid)
        except ForkError as err:
            if err.code not in _MOVED:
                raise
        try:
            late = self.registry.events(sid, length)
        except ForkError as err:
            if err.code is not ErrorCode.SESSION_NOT_FOUND:
                raise
            late = []
        if late:
            self.registry.append(successor, [NewEvent(e.type, e.data, e.extra) for e in late])
        self._drop(sid)

    def _compacted(self, log: _Log, rows: Sequence[tuple[str, dict[str, Any]]],
                   kept: set[tuple[str, str]]) -> Sequence[NewEvent]:
        """The events of a session holding only ``rows`` (oldest first in each namespace), each
        with the channel values it reads and its pending writes."""
        events: builtins.list[NewEvent] = []
        written: set[tuple[str, str, str]] = set()
        for ns, data in rows:
            versions = self._versions(data)
            with self._lock:
                blobs = []
                for ch, version in versions.items():
                    key = (ns, ch, str(version))
                    if key in log.blobs and key not in written:
                        written.add(key)
                        blobs.append([ch, version, *log.blobs[key]])
                stored = list(log.writes.get((ns, data["id"]), {}).items())
            parent = data["parent"] if (ns, data["parent"]) in kept else None
            events.append(NewEvent(CHECKPOINT_EVENT, {**data, "parent": parent, "blobs": blobs}))
            by_task: dict[tuple[str, str], list[list[Any]]] = {}
            for (task, idx), (_task, channel, value, path) in stored:
                by_task.setdefault((task, path), []).append([idx, channel, *value])
            events.extend(NewEvent(WRITES_EVENT, {"ns": ns, "id": data["id"], "task": task, "path": path,
                                                  "writes": packed})
                          for (task, path), packed in by_task.items())
        return events

    # -- async twins ------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``get_tuple`` in a worker thread."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """``list`` in a worker thread."""
        rows = await asyncio.to_thread(lambda: [*self.list(config, filter=filter, before=before, limit=limit)])
        for row in rows:
            yield row

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        """``put`` in a worker thread."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        """``put_writes`` in a worker thread."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """``delete_thread`` in a worker thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """``delete_for_runs`` in a worker thread."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """``copy_thread`` in a worker thread."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``prune`` in a worker thread."""
        await asyncio.to_thread(lambda: self.prune(thread_ids, strategy=strategy))


def _config(thread_id: Any, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def _moved(thread: str, during: str) -> ForkError:
    return ForkError(ErrorCode.INTERNAL,
                     f'thread "{thread}" moved to another session {_ATTEMPTS} times during one {during}')


def _taken(thread: str) -> ForkError:
    return errors.invalid(f'thread "{thread}" has checkpoints already: copy_thread copies into a new thread')


def _latest(log: _Log) -> set[tuple[str, str]]:
    return {(ns, newest) for ns, newest in log.newest.items()}


def _without(log: _Log, runs: set[str]) -> set[tuple[str, str]]:
    return {(ns, cid) for ns, saved in log.checkpoints.items() for cid, data in saved.items()
            if data.get("run") not in runs}

