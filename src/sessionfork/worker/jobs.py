"""Fork requests as RQ jobs, through RQ's documented API only: the serializer, the queue, enqueue.

The job function's dotted path, ``sessionfork.jobs.fork``, is a public contract: a job is
``fork(<request JSON as a string>)`` with the request id as RQ job id, serialized as JSON (never
pickled). ``worker.request_worker.RequestWorker`` refuses any job that is not exactly that.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
from rq import Queue, Retry, Worker
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job

from ..core.config import Settings
from ..protocol.rq_layout import JOB_FUNCTION as JOB_FUNCTION


class JSONSerializer:
    """RQ serializer: plain JSON via msgspec, readable by ``rq.serializers.JSONSerializer`` too."""

    @staticmethod
    def dumps(obj: Any) -> bytes:
        return msgspec.json.encode(obj)

    @staticmethod
    def loads(data: bytes | str) -> Any:
        return msgspec.json.decode(data)


def make_queue(redis: Any, settings: Settings, job_class: type[Job] = Job) -> Queue:
    """The fork queue on ``redis`` (JSON jobs); workers pass their own ``job_class``."""
    return Queue(settings.queue, connection=redis, serializer=JSONSerializer, job_class=job_class)


def enqueue(queue: Queue, payload: bytes, request_id: str, settings: Settings) -> bool:
    """Enqueue one request as a unique job with RQ's own API (the job id is the request id).

    Returns False when a job with that id exists already (RQ's unique enqueue). The clients do not
    use it: they enqueue with the enqueue script (``protocol.enqueue``), which also refuses a request
    id kept for a different request and keeps the request's identity in the job hash; this is the
    reference the job hash is checked against, and a way to reach the worker's own conflict check.
    """
    try:
        queue.enqueue_call(
            JOB_FUNCTION, args=(payload.decode(),), job_id=request_id, unique=True,
            retry=Retry(max=settings.retries) if settings.retries else None,
            timeout=settings.job_timeout, result_ttl=settings.job_ttl, failure_ttl=settings.outcome_ttl,
        )
    except DuplicateJobError:
        return False
    return True


def queued_request(redis: Any, request_id: str) -> tuple[str, str] | None:
    """The RQ job of ``request_id`` on ``redis`` as (its status, the request JSON it carries);
    ``None`` when there is no such job (or RQ cannot load it)."""
    try:
        job = Job.fetch(request_id, connection=redis, serializer=JSONSerializer)
    except NoSuchJobError:
        return None
    except Exception:  # a job hash RQ cannot load: shown as not found, the record tells the rest
        return None
    args = job.args
    payload = args[0] if args and isinstance(args[0], str) else ""
    return _text(job.get_status(refresh=False)), payload


def is_final_attempt(job: Job) -> bool:
    """No RQ retry is left after this run."""
    return not job.retries_left


class WorkerRow(msgspec.Struct, rename="camel", kw_only=True):
    """What an operator sees of one worker: its name, RQ state (``idle``, ``busy``, ``suspended``
    ...), the request it holds (``None``: none) and its last heartbeat (epoch ms; 0: none)."""

    name: str
    state: str
    current_request: str | None
    last_heartbeat: int


def worker_rows(redis: Any, settings: Settings) -> list[WorkerRow]:
    """Every registered worker of ``settings.queue`` on ``redis``, by name."""
    rows = [WorkerRow(name=w.name, state=_text(w.get_state()), current_request=w.get_current_job_id(),
                      last_heartbeat=0 if w.last_heartbeat is None else int(w.last_heartbeat.timestamp() * 1000))
            for w in Worker.all(queue=make_queue(redis, settings))]
    return sorted(rows, key=lambda row: row.name)


def _text(value: Any) -> str:
    """An RQ status (an enum of strings on RQ 3, a string on RQ 2) as its text."""
    return str(getattr(value, "value", value))


def fresh_workers(redis: Any, settings: Settings) -> list[str]:
    """Names of the workers of ``settings.queue`` whose heartbeat is younger than their TTL."""
    cutoff = datetime.now(UTC).timestamp() - settings.worker_ttl
    return [w.name for w in Worker.all(queue=make_queue(redis, settings))
            if w.last_heartbeat is not None and w.last_heartbeat.timestamp() >= cutoff]
