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


def eval_many(redis: Any, calls: Sequence[Call], *, parallel: int = 8) -> list[Any]:
    """Results of ``calls`` in order; one round trip on a server, one per call on a cluster."""
    if not calls:
        return []
    if isinstance(redis, RedisCluster):
        if len(calls) == 1 or parallel <= 1:
            return [script(keys=list(keys), args=list(args)) for script, keys, args in calls]
        with ThreadPoolExecutor(max_workers=min(parallel, len(calls))) as pool:
            return list(pool.map(lambda c: c[0](keys=list(c[1]), args=list(c[2])), calls))
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        try:
            return list(pipe.execute())
        except NoScriptError:
            if attempt == 2:
                raise
            for script in {id(c[0]): c[0] for c in calls}.values():
                script.sha = redis.script_load(script.script)
    raise AssertionError("unreachable")
