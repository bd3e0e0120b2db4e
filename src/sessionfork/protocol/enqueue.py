"""The one enqueue path of both clients: ``scripts/enqueue.lua``, as ``FCALL`` or as ``EVALSHA``.

The script is also shipped as a Redis Functions library (``library()``: library ``sessionfork``,
function ``sf_enqueue`` for producers in any language, and the same under ``VERSIONED``, a name of
the script's text, for the Python clients; beside it the read-only ``sf_outcome``, ``OUTCOME_SOURCE``:
a request's reply JSON however its record is stored), loaded by the operator with ``sessionfork
load-functions`` (``FUNCTION LOAD REPLACE``; again after each upgrade). A role may then run the
project's enqueue code and nothing else: the ``sf-scheduler`` ACL role has ``FCALL`` and no
``EVAL``/``EVALSHA``/``SCRIPT``/``FUNCTION`` (``ops.acl``).

``Settings.enqueue`` (``SESSIONFORK_ENQUEUE``) chooses the route: ``auto`` (default) calls
``FCALL`` and, when this release's library is not loaded (or the user may not ``FCALL``), falls
back to ``EVALSHA`` for the rest of the client's life; ``fcall`` only ever calls the function
(an unloaded library is an error naming the command that loads it); ``eval`` never tries it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from ..core import errors, keys, lua
from ..core.config import ENQUEUE_MODES as MODES
from ..core.config import Settings
from ..core.settings import REQUEST_LIMIT
from . import rq_layout as rq_layout

LIBRARY: Final = "sessionfork"
FUNCTION: Final = "sf_enqueue"
SPEC: Final = lua.Spec("enqueue", ("job", "queue", "record", "queues?"), ("request_id", "request", "fields*"),
                       __package__)
"""The enqueue script's calling contract (``scripts/enqueue.lua`` of this package)."""
SOURCE: Final = lua.source("enqueue.lua", SPEC.package)
"""The enqueue script's text (the README's any-language recipe)."""
SHA: Final = hashlib.sha1(SOURCE.encode()).hexdigest()
VERSIONED: Final = f"{FUNCTION}_{SHA[:12]}"
"""The same function under a name of this script's text: what the Python clients call, so that a
library loaded by an older release is "not found" (never run with a different contract)."""


OUTCOME_FUNCTION: Final = "sf_outcome"
OUTCOME_SPEC: Final = lua.Spec("outcome", ("record",), (), __package__)
"""The reply read's calling contract (``scripts/outcome.lua`` of this package: the request's record)."""
OUTCOME_SOURCE: Final = lua.source("outcome.lua", OUTCOME_SPEC.package)
"""The reply read (``scripts/outcome.lua``): ``FCALL sf_outcome 1 sf:req:<id>`` or ``EVAL`` of this
text with the same key answers the request's reply JSON (the bytes the Python clients' reply
encodes to), whichever layout stored it (``core.records``), or nil while none is stored."""


def library() -> str:
    """The Redis Functions library: ``sf_enqueue`` (and ``VERSIONED``) run the enqueue script with
    their keys and args; ``sf_outcome`` (flag ``no-writes``: ``FCALL_RO`` and replicas may run it)
    reads a request's reply."""
    return (f"#!lua name={LIBRARY}\n"
            f"local function enqueue(KEYS, ARGV)\n{SOURCE}end\n"
            f"local function outcome(KEYS, ARGV)\n{OUTCOME_SOURCE}end\n"
            f"redis.register_function('{FUNCTION}', enqueue)\n"
            f"redis.register_function('{VERSIONED}', enqueue)\n"
            f"redis.register_function{{function_name='{OUTCOME_FUNCTION}', callback=outcome, flags={{'no-writes'}}}}\n")


def load_library(redis: Any) -> str:
    """Load (or replace) the library on ``redis``; returns its name."""
    loaded = redis.function_load(library(), replace=True)
    return loaded.decode() if isinstance(loaded, bytes) else str(loaded)


def job_call(request_id: str, payload: bytes, settings: Settings, when: datetime) -> tuple[list[Any], list[Any]]:
    """The enqueue script's KEYS and ARGV for a request: RQ's job hash and queue, the request's
    record, RQ's queue set; the request id, its JSON, then the job hash ``rq_layout.job_fields``.

    ``INVALID_REQUEST`` for a request over ``REQUEST_LIMIT`` bytes, which the script would refuse:
    raised before any Redis call, with the worker's message."""
    if len(payload) > REQUEST_LIMIT:
        raise errors.invalid(f"request is {len(payload)} bytes, over the limit of {REQUEST_LIMIT}")
    return SPEC.build(dict(
        job=rq_layout.job_key(request_id), queue=rq_layout.queue_key(settings.queue), record=keys.request(request_id),
        queues=rq_layout.QUEUES, request_id=request_id, request=payload,
        fields=rq_layout.job_fields(payload, settings, when)))


def _unserved(exc: Exception) -> bool:
    """The function cannot serve this client: not loaded, or FCALL not granted (try EVALSHA)."""
    return isinstance(exc, NoPermissionError) or (
        isinstance(exc, ResponseError) and "function not found" in str(exc).lower())


class Route:
    """Which command enqueues: FCALL while the library serves, EVALSHA otherwise (per ``mode``)."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"enqueue mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.fcall = mode != "eval"

    def command(self, call_keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        if self.fcall:
            return ("FCALL", VERSIONED, len(call_keys), *call_keys, *args)
        return ("EVALSHA", SHA, len(call_keys), *call_keys, *args)

    def retry_after(self, command: tuple[Any, ...], result: Any) -> str | None:
        """After ``command`` answered ``result``: ``"fallback"`` to re-run with EVALSHA, ``"load"``
        to SCRIPT LOAD and re-run, or None (done). Concurrent calls may share a route: what was
        sent decides, not the route's state now."""
        if not isinstance(result, Exception):
            return None
        if command[0] == "FCALL" and _unserved(result):
            if self.mode == "fcall":
                raise ResponseError(f"{result} (load the enqueue library: sessionfork load-functions)")
            self.fcall = False
            return "fallback"
        if isinstance(result, NoScriptError):
            return "load"
        if isinstance(result, NoPermissionError):  # e.g. the sf-scheduler role, library not loaded
            self.fcall = self.mode != "eval"  # the next call tries the library again (loaded by then?)
            raise NoPermissionError(f"{result} (is the enqueue library loaded? sessionfork load-functions)")
        return None


class Enqueuer:
    """Run the enqueue script on a sync ``redis.Redis``; returns 1, 0 or -1 (see the script)."""

    def __init__(self, redis: Any, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self.route = Route(settings.enqueue)

    def __call__(self, call_keys: Sequence[str], args: Sequence[Any]) -> int:
        for _ in range(3):
            command = self.route.command(call_keys, args)
            try:
                result: Any = self.redis.execute_command(*command)
            except ResponseError as exc:
                result = exc
            retry = self.route.retry_after(command, result)
            if retry == "load":
                self.redis.script_load(SOURCE)
            elif retry is None:
                break
        if isinstance(result, Exception):
            raise result
        return int(result)


class AsyncEnqueuer:
    """``Enqueuer`` on ``redis.asyncio``; ``with_read`` pipelines one more command after it."""

    def __init__(self, redis: Any, settings: Settings) -> None:
        self.redis = redis
        self.route = Route(settings.enqueue)

    async def __call__(self, call_keys: Sequence[str], args: Sequence[Any]) -> int:
        enqueued, _ = await self.with_read(call_keys, args, ("PING",))
        return int(enqueued)

    async def with_read(self, call_keys: Sequence[str], args: Sequence[Any], read: tuple[Any, ...]) -> tuple[Any, Any]:
        """The enqueue's result and ``read``'s, sent in one round trip (two or three after a fallback)."""
        for _ in range(3):
            command = self.route.command(call_keys, args)
            pipe = self.redis.pipeline(transaction=False)
            pipe.execute_command(*command)
            pipe.execute_command(*read)
            enqueued, other = await pipe.execute(raise_on_error=False)
            retry = self.route.retry_after(command, enqueued)
            if retry == "load":
                await self.redis.script_load(SOURCE)
            elif retry is None:
                break
        for result in (enqueued, other):
            if isinstance(result, Exception):
                raise result
        return enqueued, other
