"""A worker's RQ bookkeeping of one job as riders of the request's own round trips (no RQ import:
the commands are ``SeamWorker.start`` and ``SeamWorker.finish``'s, added to the pipelines that
``worker.trip.Trip`` and ``worker.outcomes.Outcomes.record`` send), and of a batch of jobs as one
script call each (``JobsStart``, ``JobsFinish``): RQ's own methods write their commands into a
pipeline that is never sent (``recorded``), and ``scripts/apply.lua`` runs them on the server, so
every key and field RQ writes is RQ's, on any RQ version, for one command where a pipeline sends
dozens per job."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ...core import lua

if TYPE_CHECKING:
    from .worker import SeamWorker

APPLY: Final = lua.source("apply.lua", __package__)
"""``scripts/apply.lua``: sent whole (EVAL, a few hundred bytes), so that a server that lost its
scripts never fails a batch's bookkeeping with NOSCRIPT."""


def recorded(scratch: Any) -> list[Any]:
    """The commands written into ``scratch`` (a redis-py pipeline that is never sent: its
    ``command_stack``), ``compacted``, as ``apply.lua``'s arguments: each command's word count,
    then its words."""
    out: list[Any] = []
    for words in compacted([args for args, _ in scratch.command_stack]):
        out.append(len(words))
        out.extend(words)
    return out


_ADDS: Final = frozenset({"HSET", "SADD", "ZADD"})
"""Commands that only add to their key (never delete it): one may move ahead of an ``EXPIRE``."""
_MERGED: Final = _ADDS | {"SREM", "ZREM"}


def compacted(commands: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """``commands`` (each its words, the name first, the key second), run one after the other,
    rewritten to fewer commands that leave every key exactly as they do: a batch's bookkeeping
    writes one registry per job (``ZADD`` to the started registry, ``SREM`` from the worker's
    executions, ...), here one command per registry.

    * An ``HSET``, ``SADD``, plain ``ZADD`` (key, score, member), ``SREM`` or ``ZREM`` joins the
      earlier command of the same name on the same key when no command between them names that
      key, or (for the first three, which never delete a key) only ``EXPIRE`` with a positive
      time does (a set, hash or sorted set that gets more members keeps its time to live).
    * An ``EXPIRE`` identical to the last command naming its key is dropped (within one script
      call the server's clock stands still: the same time to live, set twice).

    A command "names" a key when any of its words equals it (text or bytes alike). Replies
    differ (a joined command answers once); every other command keeps its place in order."""
    out: list[list[Any]] = []
    named: dict[bytes, list[int]] = {}  # a word -> the commands of ``out`` naming it, ascending
    open_: dict[tuple[str, bytes], int] = {}  # (name, key) -> the command of ``out`` others join
    for words in commands:
        name = str(words[0]).upper()
        key = _word(words[1]) if len(words) > 1 else None
        if key is None:
            out.append(list(words))
            continue
        naming = named.setdefault(key, [])
        at = open_.get((name, key))
        if at is not None and _joins(name, words, [out[i] for i in naming if i > at]):
            out[at].extend(words[2:])
            for word in words[2:]:
                _name(named, word, at)
            continue
        if name == "EXPIRE" and naming and _same(out[naming[-1]], words):
            continue
        out.append(list(words))
        for word in words[1:]:
            _name(named, word, len(out) - 1)
        if name in _MERGED and (name != "ZADD" or len(words) == 4):
            open_[(name, key)] = len(out) - 1
    return out


def _joins(name: str, words: Sequence[Any], later: list[list[Any]]) -> bool:
    """Whether ``words`` may join the earlier command of its name on its key, given ``later``:
    the commands after that one that name the key (see ``compacted``)."""
    if name == "ZADD" and len(words) != 4:
        return False
    if name in _ADDS:
        return all(len(w) == 3 and str(w[0]).upper() == "EXPIRE" and int(w[2]) > 0 for w in later)
    return not later


def _word(word: Any) -> bytes | None:
    """A word as the server sees it (text encoded as redis-py encodes it); ``None`` for a number."""
    if isinstance(word, bytes):
        return word
    if isinstance(word, str):
        return word.encode()
    return None


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two commands are the same words (text and bytes alike)."""
    return len(a) == len(b) and all(_token(x) == _token(y) for x, y in zip(a, b, strict=True))


def _token(word: Any) -> Any:
    return word.encode() if isinstance(word, str) else word


def _name(named: dict[bytes, list[int]], word: Any, at: int) -> None:
    """Note that command ``at`` names ``word`` (kept ascending: a joined command names its new words too)."""
    key = _word(word)
    if key is None:
        return
    seen = named.setdefault(key, [])
    if at not in seen:
        seen.append(at)
        seen.sort()


def _check(replies: list[Any]) -> list[Any]:
    """``apply.lua``'s one reply (each command's), raising the first error among them."""
    (applied,) = replies
    if isinstance(applied, Exception):
        raise applied
    for reply in applied:
        if isinstance(reply, Exception):
            raise reply
    return list(applied)


class JobStart:
    """A worker's start bookkeeping of ``job`` as a ``trip.Part``: sent at the head of the request's
    claim, in its round trip, when that trip goes on the worker's own connection (``redis``)."""

    def __init__(self, worker: SeamWorker, job: Any, queue: Any) -> None:
        self.worker, self.job, self.queue = worker, job, queue
        self.redis = worker.connection
        self.sent = False  # the server answered every start command

    def add(self, pipe: Any) -> None:
        self.worker.start(self.job, self.queue, pipe)

    def done(self, replies: list[Any]) -> None:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        self.sent = True

    def ensure(self) -> None:
        """Send the start bookkeeping now unless it rode a trip already (a request refused before
        its claim, a run that failed before it)."""
        if not self.sent:
            self.worker.until_up(lambda: self.worker.start(self.job, self.queue))
            self.sent = True


class JobFinish:
    """A worker's success bookkeeping of ``job`` as the tail of the outcome's record transaction
    (``Outcomes.record``'s ``then``), when it goes on the worker's own connection (``redis``)."""

    def __init__(self, worker: SeamWorker, job: Any) -> None:
        self.worker, self.job = worker, job
        self.redis = worker.connection
        self.sent = False  # the server ran it (with the record)
        self.result: Any = None  # the reply it stored as RQ's result

    def add(self, pipe: Any, result: Any) -> None:
        self.result = result
        self.worker.finish(self.job, result, pipe)

    def done(self, replies: list[Any]) -> None:
        for reply in replies:
            if isinstance(reply, Exception):
                self.worker.finish_failed()
                raise reply
        self.worker.finished(replies)
        self.sent = True

    def failed(self) -> None:
        self.worker.finish_failed()


class JobsStart:
    """A worker's start bookkeeping of a batch of ``jobs`` as a ``trip.Part``: one ``apply.lua``
    call at the head of the batch's claims, on the worker's own connection (``redis``)."""

    def __init__(self, worker: SeamWorker, jobs: Sequence[Any], queue: Any) -> None:
        self.worker, self.jobs, self.queue = worker, jobs, queue
        self.redis = worker.connection
        self.sent = False  # the server ran every start command
        self.executions: list[Any] = []  # RQ's execution of each job, in job order

    def add(self, pipe: Any) -> None:
        scratch = self.redis.pipeline(transaction=False)
        self.executions = self.worker.start_many(self.jobs, self.queue, scratch)
        lua.add_text(pipe, APPLY, recorded(scratch))

    def done(self, replies: list[Any]) -> None:
        _check(replies)
        self.sent = True

    def ensure(self) -> None:
        """Send the start bookkeeping now unless it rode a trip already."""
        if not self.sent:
            def send() -> None:
                pipe = self.redis.pipeline(transaction=False)
                self.add(pipe)
                self.done(pipe.execute(raise_on_error=False))
            self.worker.until_up(send)


class JobsFinish:
    """A worker's success bookkeeping of a batch of jobs (started by ``start``) as the tail of the
    outcomes' record transaction (``Outcomes.record_many``'s ``then``): one ``apply.lua`` call."""

    def __init__(self, worker: SeamWorker, start: JobsStart) -> None:
        self.worker, self.start = worker, start
        self.redis = worker.connection
        self.sent = False  # the server ran it (with the records)
        self.results: list[Any] = []  # the replies it stored as RQ's results, in job order
        self._worked = 0.0

    def add(self, pipe: Any, results: Sequence[Any]) -> None:
        self.results = list(results)
        scratch = self.redis.pipeline(transaction=False)
        self._worked = self.worker.finish_many(self.start.jobs, self.results, self.start.executions, scratch)
        lua.add_text(pipe, APPLY, recorded(scratch))

    def done(self, replies: list[Any]) -> None:
        applied = _check(replies)
        self.worker.finished_many(applied, len(self.start.jobs), self._worked)
        self.sent = True

    def failed(self) -> None:
        """The transaction failed: nothing of it ran (the executions stay, for a retry)."""
