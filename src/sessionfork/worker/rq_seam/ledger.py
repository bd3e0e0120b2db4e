"""``Ledger``: RQ's start and success bookkeeping of a batch of jobs, written out by hand.

For each job, the commands RQ's own methods send (``Execution.create`` and
``Job.prepare_for_execution`` at its start; ``Job._handle_success``, the job hash's ``EXPIRE`` and
``cleanup_execution`` at its success), built from the job's id and the worker's name without
building RQ's registries and results per job, and with every registry the jobs share written
once per batch: one ``ZADD`` of every job to the started registry, one to the finished registry,
one ``ZREM`` from the started registry and, on RQ 3, one ``SADD`` and one ``SREM`` of the worker's
executions. The success writes the two job hash fields that change (``status``, ``ended_at``)
where RQ's ``Job.save`` writes every field again with the values it read.

Every key, field, value, score and time to live is RQ's, on RQ 3 and RQ 2.12 (RQ 2 has no
``job_id`` in an execution's hash and no worker executions set; it keeps ``current_job`` in the
worker hash): ``tests/worker/test_batches.py`` compares everything a batch leaves with what RQ's
own methods leave for jobs run alone (ids and times masked). A job whose result TTL is not
positive (RQ then deletes or persists instead of expiring) is written by RQ's own methods
(``SeamWorker._finish_job``).
"""

from __future__ import annotations

from base64 import b64encode
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

from rq.executions import Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.results import Result
from rq.utils import current_timestamp, now, utcformat

Command = list[Any]
"""A command's words, its name first."""


class Ledger:
    """The bookkeeping commands of one worker's batches on one queue (see the module docstring).

    ``worker_name`` is the worker's RQ name (``worker_key``: its hash), ``started`` and
    ``finished`` the queue's registries' keys, ``held`` its intermediate queue's; ``rq_major`` says
    which RQ's layout to write (3 or 2); ``serializer`` encodes a job's result as RQ's ``Result``
    does."""

    def __init__(self, *, worker_name: str, worker_key: str, started: str, finished: str, held: str,
                 serializer: Any, rq_major: int) -> None:
        self.worker_name, self.worker_key = worker_name, worker_key
        self.started, self.finished, self.held = started, finished, held
        self.serializer = serializer
        self.rq3 = rq_major >= 3
        # RQ 3's index of a worker's executions (RQ 2 has none).
        self.worker_executions: str = getattr(Execution("", "", None, worker_name=worker_name),  # type: ignore[arg-type]
                                              "worker_executions_key", "")

    def start(self, jobs: Sequence[Job], ttl: int) -> tuple[list[Command], list[Execution]]:
        """RQ's start of each of ``jobs`` with the heartbeat TTL ``ttl`` (seconds): the commands,
        and each job's ``Execution`` (its id and times as written), in job order."""
        out: list[Command] = []
        executions: list[Execution] = []
        right_now, stamp = now(), current_timestamp()
        text = utcformat(right_now)
        for job in jobs:
            execution = Execution(id=uuid4().hex, job_id=job.id, connection=job.connection,
                                  worker_name=self.worker_name)
            execution.created_at = execution.last_heartbeat = right_now
            at = right_now.timestamp()
            key = execution.key
            own = ["id", execution.id, "job_id", job.id] if self.rq3 else ["id", execution.id]
            out.append(["HSET", key, *own, "created_at", at, "last_heartbeat", at, "worker_name", self.worker_name])
            out.append(["EXPIRE", key, ttl])
            runs = ExecutionRegistry.key_template.format(job.id)
            out.append(["ZADD", runs, stamp + ttl + 60, execution.id])
            out.append(["EXPIRE", runs, ttl + 60])
            job.worker_name, job.last_heartbeat, job.started_at = self.worker_name, right_now, right_now
            job._status = JobStatus.STARTED
            out.append(["HSET", job.key, "last_heartbeat", text, "status", JobStatus.STARTED.value, "started_at", text,
                        "worker_name", self.worker_name])
            out.append(["LREM", self.held, 1, job.id])
            executions.append(execution)
        out.append(["ZADD", self.started, *_scored(stamp + ttl, [e.composite_key for e in executions])])
        if self.rq3:
            out.append(["SADD", self.worker_executions, *(e.composite_key for e in executions)])
            out.append(["EXPIRE", self.worker_executions, ttl + 60])
        return out, executions

    def finish(self, jobs: Sequence[Job], results: Sequence[Any], executions: Sequence[Execution],
               result_ttl: int) -> list[Command]:
        """RQ's success of each of ``jobs`` (started by ``start``: ``executions``) with its result,
        kept ``result_ttl`` seconds (positive), in job order; sets each job's ``ended_at``."""
        out: list[Command] = []
        ended = now()
        text, stamp, at = utcformat(ended), current_timestamp(), ended.timestamp()
        for job, result, execution in zip(jobs, results, executions, strict=True):
            job.ended_at = ended
            job._status = JobStatus.FINISHED
            out.append(["HSET", job.key, "status", JobStatus.FINISHED.value, "ended_at", text])
            fields = ["type", Result.Type.SUCCESSFUL.value, "worker_name", self.worker_name]
            if result is not None:
                fields += ["return_value", b64encode(self.serializer.dumps(result)).decode()]
            fields += ["execution_id", execution.id, "execution_started_at", execution.created_at.timestamp(),
                       "execution_ended_at", at]
            results_key = Result.get_key(job.id)  # type: ignore[no-untyped-call]
            out.append(["XADD", results_key, "MAXLEN", "~", "10", "*", *fields])
            out.append(["EXPIRE", results_key, result_ttl])
            out.append(["EXPIRE", job.key, result_ttl])
            out.append(["DEL", execution.key])
            out.append(["ZREM", ExecutionRegistry.key_template.format(job.id), execution.id])
        ids = [job.id for job in jobs]
        out.append(["ZADD", self.finished, *_scored(stamp + result_ttl, ids)])
        composite = [e.composite_key for e in executions]
        out.append(["ZREM", self.started, *composite])
        if self.rq3:
            out.append(["SREM", self.worker_executions, *composite])
        else:
            out.append(["HDEL", self.worker_key, "current_job"])  # RQ 2's worker names its current job
        return out


def _scored(score: int, members: Sequence[str]) -> list[Any]:
    """``ZADD``'s score-member pairs: every member with ``score``."""
    return [word for member in members for word in (score, member)]
