"""Queue entries as a fork worker loads them (``ForkJob``, and ``DequeuedJob`` for the dequeue) and
the refusal of those it cannot load (``EntryRefused``): every RQ name used here is listed, with its
reason, in the package docstring (``sessionfork.worker.rq_seam``)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from rq.exceptions import NoSuchJobError
from rq.job import Job


class MalformedJob(ValueError):
    """A job hash that exists but cannot be loaded (no ``data``)."""


class ForkJob(Job):
    """RQ's Job as a fork worker must load it: nothing in the hash may make the worker act.

    * A job hash without ``data`` is ``MalformedJob`` (RQ skips it like an expired job, so its
      request would never get an outcome); the worker refuses it.
    * Webhooks and success/failure/stopped callbacks are dropped: anyone who may enqueue may write
      a job hash, and RQ would POST to those URLs or import and call those names.
    """

    def restore(self, raw_data: Any) -> Any:
        # RQ parses each timestamp with strptime (a sixth of a batch job's load): a timestamp as
        # RQ's utcformat writes it is parsed here by fromisoformat (the same datetime), any other
        # is left to RQ (its old format, or one it refuses).
        dates = {}
        if isinstance(raw_data, dict):
            dates = {field: value for field in _DATES if isinstance(value := raw_data.get(field), bytes)
                     and _UTCFORMAT.fullmatch(value)}
            if dates:
                raw_data = {k: v for k, v in raw_data.items() if k not in dates}
        try:
            restored = super().restore(raw_data)
        except NoSuchJobError as exc:
            raise MalformedJob(str(exc)) from None
        for field, value in dates.items():
            setattr(self, _DATES[field], datetime.fromisoformat(value.decode()))
        self.webhooks = []
        self._success_callback_name = self._failure_callback_name = self._stopped_callback_name = None
        return restored


_DATES = {b"created_at": "created_at", b"enqueued_at": "enqueued_at", b"started_at": "started_at",
          b"ended_at": "ended_at", b"last_heartbeat": "last_heartbeat"}
"""The job hash's timestamp fields, each the attribute ``Job.restore`` sets from it."""

_UTCFORMAT = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
"""A timestamp as RQ's ``utcformat`` writes it (``%Y-%m-%dT%H:%M:%S.%fZ``): ``fromisoformat`` reads
it as RQ's ``utcparse`` does (UTC, ``timezone.utc``)."""


class DequeuedJob(ForkJob):
    """``ForkJob`` as the dequeue loads a queue entry: the entry itself must be a job id by RQ's
    rule and name a job hash, else it is refused (with an outcome), never skipped."""

    @classmethod
    def fetch(cls, id: str, connection: Any = None, serializer: Any = None) -> Any:
        refuse_colon(id)
        try:
            return super().fetch(id, connection=connection, serializer=serializer)
        except NoSuchJobError:
            # RQ drops such an entry silently, leaving it in its intermediate queue and its id
            # with no outcome.
            raise MalformedJob("the queue entry names no job hash") from None

    @classmethod
    def loaded(cls, id: str, data: dict[bytes, bytes], connection: Any, serializer: Any) -> Any:
        """``fetch`` from a job hash read already (``data``: HGETALL's), with the same refusals."""
        refuse_colon(id)
        if not data:
            raise MalformedJob("the queue entry names no job hash")
        # The serializer set as an attribute: the constructor checks it against RQ's runtime
        # Protocol each time, a third of the job's load on Python 3.11 (the worker's is checked once).
        job = cls(id, connection=connection)
        job.serializer = serializer
        job.restore(data)
        return job


def refuse_colon(id: str) -> None:
    if ":" in id:
        # RQ reads "<job>:<execution>" as an execution key and would load the job <job> instead.
        raise ValueError("Job ID must only contain letters, numbers, underscores and dashes")


class Taken:
    """Queue entries one ``SeamWorker.take`` moved to the intermediate queue: each entry's bytes
    and its job hash (HGETALL's mapping; empty when it names none), in queue order."""

    def __init__(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        self.entries = entries


class EntryRefused(Exception):
    """A queue entry that is not a loadable job; ``job_id`` is its text, ``raw`` its bytes."""

    def __init__(self, job_id: str, raw: bytes, reason: str) -> None:
        super().__init__(reason)
        self.job_id, self.raw, self.reason = job_id, raw, reason


def is_text(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def entry_of(exc: Exception) -> EntryRefused:
    """What RQ's dequeue failed on: a job id it refuses, a malformed hash, bytes that are not text."""
    if isinstance(exc, UnicodeDecodeError):
        return EntryRefused("", bytes(exc.object), "queue entry is not UTF-8 text")
    job_id = getattr(exc, "job_id", None)
    if job_id is None:
        raise exc
    text = str(job_id)
    # The reason does not repeat the id (the outcome carries it, escaped and bounded).
    return EntryRefused(text, text.encode(errors="surrogateescape"),
                        f"queue entry is not a loadable sessionfork job ({type(exc).__name__}: {_bounded(exc)})")


def _bounded(exc: Exception) -> str:
    return repr(str(exc)[:200])[1:-1]

