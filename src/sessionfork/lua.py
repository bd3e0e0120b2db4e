"""The Lua scripts (``scripts/*.lua``), registered once per client, and how to run them in bulk.

Scripts take key names only from ``KEYS``. ``eval_many`` runs several script calls in one round
trip on a single server (EVALSHA in a pipeline, without redis-py's per-pipeline SCRIPT EXISTS
round trip; a NOSCRIPT after a server restart loads the scripts and runs the batch again, which
is safe because every batch it is given either reads only or fails whole on NOSCRIPT). A
cluster client cannot pipeline scripts, so there the calls run one by one, each on its key's node.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

Call = tuple[Script, Sequence[str], Sequence[Any]]


def source(name: str) -> str:
    """The text of ``scripts/<name>``."""
    return resources.files(__package__).joinpath("scripts", name).read_text(encoding="utf-8")


def register(redis: Any, name: str) -> Script:
    """Register ``scripts/<name>`` with ``redis`` (its SHA is computed locally; loaded on demand)."""
    script: Script = redis.register_script(source(name))
    return script


class NotReplicated(Exception):
    """WAIT saw fewer replicas acknowledge a write than asked; the write stands on the primary.

    Raised so that the request is retried (it is idempotent): the retry waits again.
    """


def eval_many(redis: Any, calls: Sequence[Call], *, parallel: int = 8, replicas: int = 0,
              wait_ms: int = 1000) -> list[Any]:
    """Results of ``calls`` in order; one round trip on a server, one per call on a cluster.

    With ``replicas``, each write is followed by WAIT on the same connection, and
    ``NotReplicated`` is raised when fewer replicas acknowledged it within ``wait_ms``.
    """
    if not calls:
        return []
    if isinstance(redis, RedisCluster):
        def one(call: Call) -> Any:
            script, keys, args = call
            result = script(keys=list(keys), args=list(args))
            if replicas:
                node = redis.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
                acked = redis.execute_command("WAIT", replicas, wait_ms, target_nodes=node)  # type: ignore[no-untyped-call]
                _check(acked, replicas)
            return result

        if len(calls) == 1 or parallel <= 1:
            return [one(c) for c in calls]
        with ThreadPoolExecutor(max_workers=min(parallel, len(calls))) as pool:
            return list(pool.map(one, calls))
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        if replicas:
            pipe.execute_command("WAIT", replicas, wait_ms)
        try:
            results = list(pipe.execute())
            if replicas:
                _check(results.pop(), replicas)
            return results
        except NoScriptError:
            if attempt == 2:
                raise
            for script in {id(c[0]): c[0] for c in calls}.values():
                script.sha = redis.script_load(script.script)
    raise AssertionError("unreachable")


def _check(acknowledged: Any, wanted: int) -> None:
    got = int(acknowledged)
    if got < wanted:
        raise NotReplicated(f"{got} of {wanted} replica(s) acknowledged the write in time")
