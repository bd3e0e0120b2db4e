"""The RQ side of a request: the job function, its serializer, enqueueing.

The job function's dotted path, ``sessionfork.jobs.fork``, is a public contract: a job is
``fork(<request JSON as a string>)`` with the request id as RQ job id, serialized as JSON (never
pickled). ``ForkWorker`` (module ``workers``) refuses any job that is not exactly that.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
from rq import Queue, Retry
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job
from rq.job import get_current_job as _current_job

from .config import Settings, from_environ
from .registry import Registry
from .service import ForkService
from .wire import Reply

JOB_FUNCTION = "sessionfork.jobs.fork"


class JSONSerializer:
    """RQ serializer: plain JSON via msgspec, readable by ``rq.serializers.JSONSerializer`` too."""

    @staticmethod
    def dumps(obj: Any) -> bytes:
        return msgspec.json.encode(obj)

    @staticmethod
    def loads(data: bytes | str) -> Any:
        return msgspec.json.decode(data)


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
        try:
            restored = super().restore(raw_data)
        except NoSuchJobError as exc:
            raise MalformedJob(str(exc)) from None
        self.webhooks = []
        self._success_callback_name = self._failure_callback_name = self._stopped_callback_name = None
        return restored


def make_queue(redis: Any, settings: Settings) -> Queue:
    return Queue(settings.queue, connection=redis, serializer=JSONSerializer, job_class=ForkJob)


def enqueue(queue: Queue, payload: bytes, request_id: str, settings: Settings) -> bool:
    """Enqueue one request as a unique job (the job id is the request id).

    Returns False when a job with that id exists already (RQ's unique enqueue): the request is
    queued or done, and its one outcome answers this submission too.
    """
    try:
        queue.enqueue_call(
            JOB_FUNCTION, args=(payload.decode(),), job_id=request_id, unique=True,
            retry=Retry(max=settings.retries) if settings.retries else None,
            timeout=settings.job_timeout, result_ttl=settings.outcome_ttl, failure_ttl=settings.outcome_ttl,
        )
    except DuplicateJobError:
        return False
    return True


def is_final_attempt(job: Job) -> bool:
    """No RQ retry is left after this run."""
    return not job.retries_left


def fork(payload: str) -> Reply:
    """The job function, for plain ``rq worker --serializer sessionfork.jobs.JSONSerializer``.

    ``sessionfork worker`` does not import it: it checks the name and runs its own service. Run
    by ``rq worker``, the registry and the outcomes share the queue's connection.
    """
    job = _current_job()
    if job is None:
        raise RuntimeError("sessionfork.jobs.fork runs only inside an RQ job")
    # An entry point (RQ calls it): the only place here that may read the environment.
    settings = from_environ(os.environ)
    service = ForkService.from_settings(Registry.from_settings(job.connection, settings), job.connection, settings)
    return service.handle(payload, job.id, final_attempt=is_final_attempt(job))
