"""RQ's key names and job hash, written without RQ (part of the RQ seam: see its package docstring).

Both clients enqueue with ``scripts/enqueue.lua`` (``protocol.enqueue``; the README's any-language
recipe: create the job hash and push its id, only when no job has that id and the request id is
not kept for a different request) and ``job_fields``, the one writer of the job hash: exactly the
hash RQ's own unique enqueue writes for ``worker.jobs.enqueue`` (RQ 2.12 and 3;
``tests/protocol/test_aio_job_hash.py`` compares the two field by field), plus the script's
``sf_identity``, so that workers, ``rq info`` and rq-dashboard read it like any RQ job. The job
function's name is ``JOB_FUNCTION``, inside ``data``; the script's default ``data`` (a raw producer
that sends none) names the same function (``tests/protocol/test_enqueue_script.py`` pins it).
Imports no RQ.

RQ derives its key names from a job id and a queue name; its documentation does not promise them.
"""

from __future__ import annotations

import zlib
from datetime import datetime
from typing import Final

import msgspec

from ..core.config import Settings

JOB_FUNCTION: Final = "sessionfork.jobs.fork"
"""The job function's dotted path: a public contract (``worker.jobs`` uses the same)."""

QUEUES: Final = "rq:queues"
"""RQ's set of queue keys."""

SUSPENDED: Final = "rq:suspended"
"""RQ's worker suspension key (``rq suspend`` sets it, ``rq resume`` deletes it): while it exists,
the workers of that server finish the job they hold and take no new one. A shard is one queue
server, so this key is the shard's pause (``ops.pauses``); RQ's ``suspension.WORKERS_SUSPENDED``,
pinned equal by ``tests/protocol/test_aio_job_hash.py``."""


def job_key(job_id: str) -> str:
    """RQ's job hash (``rq:job:<job id>``)."""
    return f"rq:job:{job_id}"


def queue_key(queue: str) -> str:
    """RQ's queue list (``rq:queue:<name>``): job ids, oldest first."""
    return f"rq:queue:{queue}"


def finished_key(queue: str) -> str:
    """RQ's finished job registry of a queue (``rq:finished:<name>``): job ids scored by when each
    expires (its end plus its ``result_ttl``)."""
    return f"rq:finished:{queue}"


def key_patterns(queue: str) -> dict[str, str]:
    """RQ's key names a role's ACL rules need (``queue`` already glob-escaped)."""
    return {"jobs": "rq:job:*", "queue": f"rq:queue:{queue}", "queues": QUEUES, "all": "rq:*",
            "worker_channels": "rq:pubsub:*"}


_TIMESTAMP: Final = "%Y-%m-%dT%H:%M:%S.%fZ"  # RQ's utcformat
_DESCRIPTION_ARG_MAX: Final = 75  # RQ truncates each argument's repr in a job's description


def job_fields(payload: bytes, settings: Settings, when: datetime) -> list[bytes | str | int]:
    """The RQ job hash of a request ``payload`` enqueued at ``when`` (UTC), as HSET field-value pairs.

    ``data`` is RQ's job tuple ``[function, null, [payload as a string], {}]`` as JSON (the
    serializer's ``worker.jobs.JSONSerializer``), zlib-compressed as RQ stores it.
    """
    text = payload.decode()
    data = zlib.compress(msgspec.json.encode([JOB_FUNCTION, None, [text], {}]))
    stamp = when.strftime(_TIMESTAMP)
    arg = repr(text)
    if len(arg) > _DESCRIPTION_ARG_MAX:
        arg = arg[:_DESCRIPTION_ARG_MAX] + "..."
    fields: dict[str, bytes | str | int] = {
        "created_at": stamp, "data": data, "success_callback_name": "", "failure_callback_name": "",
        "stopped_callback_name": "", "started_at": "", "ended_at": "", "last_heartbeat": "",
        "worker_name": "", "group_id": "",
    }
    if settings.retries:
        fields["retries_left"] = settings.retries
        fields["retry_intervals"] = "[0]"
    fields.update(origin=settings.queue, description=f"{JOB_FUNCTION}({arg})", enqueued_at=stamp,
                  timeout=settings.job_timeout, result_ttl=settings.job_ttl,
                  failure_ttl=settings.outcome_ttl, status="queued")
    return [item for pair in fields.items() for item in pair]
