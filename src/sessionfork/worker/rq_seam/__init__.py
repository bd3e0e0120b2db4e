"""The seam: the one place that knows RQ beyond its documented API (checked against RQ 2.12 and 3.0).

Three modules, so that what must not import RQ need not. ``worker.SeamWorker`` is the one
subclass of RQ's ``SimpleWorker`` and holds every override of an RQ worker method: the loop (the
stop flag, start-up, suspension, heartbeat and registration, teardown, the outage back-off
``until_up``), the dequeue, a job's start, success and failure bookkeeping, and the maintenance
pass with the requeue of stranded jobs. What the jobs are is the business of at most one subclass
(``sessionfork.worker.request_worker.RequestWorker``), which overrides no RQ method: it fills the hooks
``SeamWorker`` calls (``run_batch``, ``refuse_entry``, ``maintain``, ``job_ended``,
``redis_clients``). ``entries`` holds the job classes and the refusal of queue entries RQ cannot
load; both import RQ. ``riders`` (a batch's start and success bookkeeping as riders of the batch's
own round trips) imports no RQ. RQ's key names and job hash fields are ``protocol.rq_layout`` (what
producers and workers agree on; the asyncio client enqueues without RQ), which imports no RQ
either. This package's ``__init__`` imports nothing.

Everything else in sessionfork uses RQ's documented API only: ``Queue``, ``Job`` and its public
attributes, ``Retry``, the registries, ``Worker.all``, a custom serializer, a custom worker class
and job class, exception handlers. ``tests/project/test_layering.py`` fails when another module
imports ``rq`` beyond those names or touches an underscore name of an RQ object.

RQ names used here, and why:

* ``SimpleWorker`` subclassed once (``worker.SeamWorker``), overriding ``execute_job`` (documented
  for custom workers), ``bootstrap``, ``request_stop``, ``heartbeat``, ``get_heartbeat_ttl``,
  ``set_state``, ``dequeue_job_and_maintain_ttl``, ``_shutdown``, ``check_for_suspension``,
  ``teardown`` (stopping ``pubsub_thread``, RQ's command listener, when Redis is unreachable),
  ``unsubscribe`` (its ``pubsub`` and ``pubsub_thread``: the listener told to end before the
  ``UNSUBSCRIBE`` whose confirmation wakes it; with redis-py 8.2's ``stop()``, which waits for the
  thread, RQ's order left a stopping worker waiting out the listener's 60-second read),
  ``handle_job_failure``, ``run_maintenance_tasks`` and ``clean_registries``: RQ's loop strands a
  just-dequeued job on SIGTERM, quits on an entry it cannot load (a non-UTF-8 id, a malformed
  hash), quits on a Redis outage or time-out, and holds the maintenance lock for 15 minutes when
  Redis drops midway. RQ's ``_shutdown`` raises ``StopRequested`` from the signal
  handler wherever the worker is, e.g. between sending a Redis command and reading its reply (the
  connection goes back to the pool with the reply unread, and the next command reads it: on a
  loaded machine, a garbled teardown and exit status 3), or inside a maintenance pass (swallowed
  there: the worker did not stop). Here a stop request only sets the flag, read at safe points.
* ``death_penalty_class`` and ``queue_class.DEFAULT_TIMEOUT`` (``run_in_time``: RQ's job timeout
  around an in-process run), ``handle_exception`` (RQ's exception handlers for a failed run).
* ``register_birth`` and the ``birth`` field it writes in the worker hash: a worker whose hash has
  no ``birth`` (its server restarted empty, even mid-job, when the job's bookkeeping rewrites the
  hash without it) registers again (``health``, ``rq info``).
* ``_install_signal_handlers`` (called before registration), ``_stop_requested`` (read and set),
  ``_state`` (read), ``_stopped_job_id`` (read: a job stopped on request is not retried),
  ``_exc_handlers`` and ``_ordered_queues`` (passed back to RQ's own helpers): the loop above.
* ``job._handle_success``, ``job.cleanup`` and ``cleanup_execution`` (RQ's success bookkeeping of a
  job whose result TTL is 0 or none: never a fork job's) and, on RQ 2 only, ``set_current_job_id``;
  every other job's start and success bookkeeping is the ``ledger``'s (below), a job run on its own
  being a batch of one. RQ's worker counters, batched:
  the worker hash's ``successful_job_count`` field (``HINCRBY`` by the jobs since the last beat,
  where RQ's ``increment_successful_job_count`` adds 1 per job) and
  ``increment_total_working_time``, sent with the heartbeat (``_beat``) and at ``teardown``. Each
  added to a round trip the request makes anyway (RQ's own path
  takes a dozen round trips and a WATCH loop for dependents, which fork jobs never have): a batch's
  start ahead of its claims (``riders.Started``; pipelined, not in a transaction), its success
  in the transaction that records the outcomes (``riders.Finished``), with ``EXISTS`` of
  ``suspension.WORKERS_SUSPENDED`` (``rq:suspended``) as the loop's next ``check_for_suspension``
  (RQ's own check is a round trip per job). ``results.Result.create``: RQ's result made the stored
  outcome when another attempt's was stored first. ``handle_job_failure`` (its
  ``execution=`` argument is new in RQ 3) and ``job._status`` for failures: RQ's own path.
* ``work``, for its ``max_jobs`` only: RQ counts one per ``execute_job``, and a batch is one call;
  the budget is counted per job, and the dequeue returns ``None`` (RQ's loop ends) once it is spent.
* batches (``batch`` above 1, one queue): ``take`` moves up to ``batch`` entries from the queue's
  head to its ``intermediate_queue_key`` with their job hashes in one script call
  (``scripts/take.lua``: RQ's dequeue, an ``LMOVE`` and an ``HGETALL`` per entry, for many); each
  is loaded as the dequeue loads one (``DequeuedJob.loaded``: ``Job.restore`` of the hash, the
  worker's resolved serializer set as the job's ``serializer`` attribute, not passed to the
  constructor, which checks it against RQ's runtime Protocol per job), the others refused alone. RQ's
  start and success bookkeeping of a batch (``start``, ``finish``) is written by
  ``ledger.Ledger``: per job what ``Execution.create``, ``prepare_for_execution``,
  ``_handle_success`` and ``cleanup_execution`` write (RQ's key names from
  ``Execution.key``, ``composite_key``, RQ 3's ``worker_executions_key``,
  ``ExecutionRegistry.key_template``, ``Result.get_key``, the queue's registries' ``key``; its
  values from ``rq.utils.now``, ``current_timestamp`` and ``utcformat``, ``JobStatus``,
  ``Result.Type`` and the worker's ``serializer``; the job's ``worker_name``, ``last_heartbeat``,
  ``started_at``, ``ended_at`` and ``_status`` set as RQ sets them), each registry the jobs share
  written once per batch, by two scripts (``scripts/started.lua``, ``scripts/finished.lua``: a
  few words per job); the worker's own state by RQ's methods, once per batch. The start's call
  rides the head of the batch's first round trip (``riders.Started``), the success's the
  records' transaction (``riders.Finished``), each an ``EVAL`` of the script's text (never a
  NOSCRIPT: ``lua.add_loaded``). RQ 3 and RQ 2.12
  each have their layout (``tests/worker/test_batches.py`` compares every key, field, score and
  time to live with what RQ's own methods write).
* the dequeue (``dequeue_job_and_maintain_ttl``): several queues, RQ's own ``Queue.dequeue_any``.
  One queue: one non-blocking ``LMOVE`` to the ``intermediate_queue_key`` pipelined with
  ``HGETALL`` of the job hash (``Job.key_for``) of the entry the last job's finish saw at the
  queue's front (``LINDEX``), used only if the entry moved is that one; when none waits (or the
  finish saw the queue empty: no ``take`` or ``LMOVE`` first), RQ's ``Queue.lmove`` done as RQ
  does it (``BLMOVE`` from the queue's head to the intermediate queue's tail for the wait, raising
  RQ's ``DequeueTimeout`` when it passes; ``LMOVE`` with no wait) and pipelined with
  ``scripts/last.lua``, the intermediate queue's last entry and its job hash, used only if that
  entry is the one moved (another worker's move may land between the two). The job is then built
  as ``Job.fetch`` builds it (``restore`` of the hash), its queue by ``Queue.from_queue_key``, and
  a failure carries ``job_id`` and ``queue`` as RQ's dequeue's do.
* ``Job.fetch`` overridden for the dequeue only: a queue entry with a ``:`` (RQ would load the
  job before the colon, an execution key) or naming no job hash (RQ skips it and leaves it in the
  intermediate queue) is refused with an outcome.
* ``Job.restore`` overridden, clearing ``webhooks`` and ``_success_callback_name``,
  ``_failure_callback_name``, ``_stopped_callback_name``: a job hash written by a scheduler must
  not make a worker POST to a URL or import a name; and its five timestamp fields (the attributes
  ``created_at``, ``enqueued_at``, ``started_at``, ``ended_at``, ``last_heartbeat``) set from
  ``datetime.fromisoformat`` when a field is as RQ's ``utcformat`` writes it (RQ's ``strptime`` was
  a sixth of a batch job's load), any other left to RQ (``tests/worker/test_job_restore.py``
  compares the job with RQ's own ``restore`` of the same hash). ``Job.key_for``: a refused queue
  entry's job hash is deleted, not leaked.
* ``registry.clean_registries``, ``worker_registration.clean_worker_registry``,
  ``queue.intermediate_queue`` (its ``key``, ``get_job_ids``, ``set_first_seen``,
  ``get_first_seen``, ``get_first_seen_key``, ``cleanup``), ``queue.acquire_maintenance_lock`` /
  ``release_maintenance_lock``: maintenance, plus requeueing a job stranded in the intermediate
  queue by a killed worker after ``abandoned_after`` seconds (RQ waits minutes, then fails it).
* RQ's key layout (``protocol.rq_layout``): ``rq:job:<id>``, ``rq:queue:<name>``, ``rq:queues`` for the
  clients' enqueue script, and the patterns of the ACL rules (``rq:job:*``, ``rq:*``,
  ``rq:pubsub:*``). ``tests/protocol/test_aio_job_hash.py`` pins them against RQ's ``Job.key_for``,
  ``Queue.key`` and ``Queue.redis_queues_keys``.
* RQ's job hash fields (``protocol.rq_layout.job_fields``): what RQ's unique enqueue writes (``data`` as
  zlib-compressed JSON, ``description``, timestamps in RQ's format, empty callback fields ...),
  compared field by field with RQ's own in ``tests/protocol/test_aio_job_hash.py``.
"""
