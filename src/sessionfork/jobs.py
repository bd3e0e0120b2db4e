"""The RQ job function ``sessionfork.jobs.fork`` and its serializer: a public contract.

A fork job is ``fork(<request JSON as a string>)`` with the request id as its RQ job id,
serialized as JSON. ``sessionfork worker`` never imports this function: it checks the name and
runs its own service. Plain ``rq worker --serializer sessionfork.jobs.JSONSerializer`` imports and
calls it (an entry point: it reads its settings from the environment).
"""

from __future__ import annotations

import os

from rq import get_current_job

from .core.config import from_environ
from .core.registry import Registry
from .core.wire import Outcome
from .worker.jobs import JOB_FUNCTION, JSONSerializer, is_final_attempt
from .worker.service import RequestService

__all__ = ["JOB_FUNCTION", "JSONSerializer", "fork"]


def fork(payload: str) -> Outcome:
    """Run one fork request inside an RQ job; the registry and outcomes share the job's connection."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("sessionfork.jobs.fork runs only inside an RQ job")
    settings = from_environ(os.environ)
    service = RequestService.from_settings(Registry.from_settings(job.connection, settings), job.connection, settings)
    return service.handle(payload, job.id, final_attempt=is_final_attempt(job))
