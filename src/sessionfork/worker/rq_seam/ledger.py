"""``Ledger``: RQ's start and success bookkeeping of a batch of jobs, written out by hand.

For each job, what RQ's own methods write (``Execution.create`` and ``Job.prepare_for_execution``
at its start; ``Job._handle_success``, the job hash's ``EXPIRE`` and ``cleanup_execution`` at its
success), written by two scripts (``scripts/started.lua``, ``scripts/finished.lua``) from each
job's id, its execution's id and its result, without building RQ's registries and results per
job, and with every registry the jobs share written once per batch: one ``ZADD`` of every job to
the started registry, one to the finished registry, one ``ZREM`` from the started registry and, on
RQ 3, one ``SADD`` and one ``SREM`` of the worker's executions. The success writes the two job
hash fields that change (``status``, ``ended_at``) where RQ's ``Job.save`` writes every field again
with the values it read. RQ's key names come from RQ's own templates, its values from RQ's own
helpers (``now``, ``current_timestamp``, ``utcformat``, ``JobStatus``, ``Result.Type``); each
script call is a few words per job, where the commands themselves are dozens.

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
from typing import Any, Final
from uuid import uuid4

from rq.executions import Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.results import Result
from rq.utils import current_timestamp, now, utcformat

from ...core import lua

_ARGS: Final = ("worker", "ttl", "stamp", "text", "at", "rq", "status")
"""The arguments both scripts take first: the worker, a TTL, the time three ways, RQ's version, a status."""
SCRIPTS: Final = lua.table(
    lua.Spec("started", (), (*_ARGS, "executions", "runs", "jobs", "started", "held", "worker_executions",
                             "each*"), __package__),
    lua.Spec("finished", (), (*_ARGS, "result_type", "executions", "runs", "jobs", "results", "finished",
                              "started", "worker_executions", "worker_hash", "each*"), __package__))
"""The ledger's scripts (``scripts/started.lua``, ``scripts/finished.lua`` of this package)."""


class Ledger:
    """The bookkeeping of one worker's batches on one queue (see the module docstring), as calls
    of ``scripts/started.lua`` and ``scripts/finished.lua`` with RQ's key prefixes and values.

    ``worker_name`` is the worker's RQ name (``worker_key``: its hash), ``started`` and
    ``finished`` the queue's registries' keys, ``held`` its intermediate queue's; ``rq_major`` says
    which RQ's layout to write (3 or 2); ``serializer`` encodes a job's result as RQ's ``Result``
    does; ``scripts`` calls the scripts on the worker's connection."""

    def __init__(self, *, worker_name: str, worker_key: str, started: str, finished: str, held: str,
                 serializer: Any, rq_major: int, scripts: lua.Scripts) -> None:
        self.worker_name, self.worker_key = worker_name, worker_key
        self.started, self.finished, self.held = started, finished, held
        self.serializer = serializer
        self.rq = "3" if rq_major >= 3 else "2"
        self.scripts = scripts
        # RQ's key names, by RQ's own templates (an execution's hash is <prefix><job id>:<execution id>).
        blank = Execution("", "", None, worker_name=worker_name)  # type: ignore[arg-type]
        self.executions = blank.key[:-1]
        self.runs = ExecutionRegistry.key_template.format("")
        self.jobs = Job.key_for("")
        self.results: str = Result.get_key("")  # type: ignore[no-untyped-call]
        # RQ 3's index of a worker's executions (RQ 2 has none).
        self.worker_executions: str = getattr(blank, "worker_executions_key", "")

    def start(self, jobs: Sequence[Job], ttl: int,
              again: Sequence[Execution] = ()) -> tuple[lua.Call, list[Execution]]:
        """RQ's start of each of ``jobs`` with the heartbeat TTL ``ttl`` (seconds): the script
        call, and each job's ``Execution`` (its id and times as written), in job order. ``again``:
        the executions of a start of the same jobs sent before whose reply was lost (it may have
        run): the same ids are written again, so that no second execution is left started."""
        executions: list[Execution] = []
        right_now, stamp = now(), current_timestamp()
        each: list[Any] = []
        for i, job in enumerate(jobs):
            execution = (again[i] if i < len(again) and again[i].job_id == job.id
                         else Execution(id=uuid4().hex, job_id=job.id, connection=job.connection,
                                        worker_name=self.worker_name))
            execution.created_at = execution.last_heartbeat = right_now
            job.worker_name, job.last_heartbeat, job.started_at = self.worker_name, right_now, right_now
            job._status = JobStatus.STARTED
            each += [job.id, execution.id]
            executions.append(execution)
        call = self.scripts.op("started", worker=self.worker_name, ttl=ttl, stamp=stamp, text=utcformat(right_now),
                               at=right_now.timestamp(), rq=self.rq, status=JobStatus.STARTED.value,
                               executions=self.executions, runs=self.runs, jobs=self.jobs, started=self.started,
                               held=self.held, worker_executions=self.worker_executions, each=each)
        return call, executions

    def finish(self, jobs: Sequence[Job], results: Sequence[Any], executions: Sequence[Execution],
               result_ttl: int, last: bool = True) -> lua.Call:
        """RQ's success of each of ``jobs`` (started by ``start``: ``executions``) with its result,
        kept ``result_ttl`` seconds (positive), in job order, as the script call; sets each job's
        ``ended_at``. ``last=False``: the worker has started a later batch already (its jobs are
        RQ 2's worker's current job, which stays)."""
        ended = now()
        each: list[Any] = []
        for job, result, execution in zip(jobs, results, executions, strict=True):
            job.ended_at = ended
            job._status = JobStatus.FINISHED
            value = "" if result is None else b64encode(self.serializer.dumps(result)).decode()
            each += [job.id, execution.id, execution.created_at.timestamp(), value]
        return self.scripts.op("finished", worker=self.worker_name, ttl=result_ttl, stamp=current_timestamp(),
                               text=utcformat(ended), at=ended.timestamp(), rq=self.rq,
                               status=JobStatus.FINISHED.value, result_type=Result.Type.SUCCESSFUL.value,
                               executions=self.executions, runs=self.runs, jobs=self.jobs, results=self.results,
                               finished=self.finished, started=self.started,
                               worker_executions=self.worker_executions, worker_hash=self.worker_key if last else "",
                               each=each)
