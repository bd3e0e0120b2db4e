"""The Lua scripts (``scripts/*.lua``), registered once per client, and how to run them in bulk.

Scripts take key names only from ``KEYS``. ``eval_many`` runs several script calls with one round
trip per server: EVALSHA in a pipeline, without redis-py's per-pipeline SCRIPT EXISTS round trip.
A NOSCRIPT (the server restarted or was flushed) loads the scripts and re-runs the calls that got
it (they did not run). On a cluster, the calls are grouped by the node that owns their first key
and each group is pipelined on that node's own connection; a call that meets a redirection
(MOVED, ASK: a failover or a resharding) is re-run through the cluster client, which follows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError, TryAgainError

from ..core import keys as keys_module

Call = tuple[Script, Sequence[str], Sequence[Any]]
_REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)


def source(name: str, package: str | None = None) -> str:
    """The text of ``scripts/<name>`` in ``package`` (default: this one, the session core's)."""
    return resources.files(package or __package__).joinpath("scripts", name).read_text(encoding="utf-8")


def register(redis: Any, name: str, package: str | None = None) -> Script:
    """Register ``scripts/<name>`` of ``package`` with ``redis`` (SHA computed locally; loaded on demand)."""
    script: Script = redis.register_script(source(name, package))
    return script


class NotReplicated(Exception):
    """WAIT saw fewer replicas acknowledge a write than asked; the write stands on the primary.

    Raised so that the request is retried (it is idempotent): the retry writes and waits again.
    """


def eval_many(redis: Any, calls: Sequence[Call], *, replicas: int = 0, wait_ms: int = 1000) -> list[Any]:
    """Results of ``calls`` in order: one round trip per server involved.

    With ``replicas``, each server's batch ends with WAIT on the same connection, and
    ``NotReplicated`` is raised when fewer replicas acknowledged the writes within ``wait_ms``.
    """
    if not calls:
        return []
    if not isinstance(redis, RedisCluster):
        return _pipelined(redis, list(calls), replicas, wait_ms)
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, (_, keys, _) in enumerate(calls):
        node = redis.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
        groups.setdefault(node.name, (node, []))[1].append(i)
    results: list[Any] = [None] * len(calls)

    def run(node: Any, indexes: list[int]) -> None:
        client = redis.get_redis_connection(node)
        batch = _pipelined(client, [calls[i] for i in indexes], replicas, wait_ms, keep_errors=_REDIRECTED)
        for i, result in zip(indexes, batch, strict=True):
            if isinstance(result, _REDIRECTED):
                script, keys, args = calls[i]
                result = script(keys=list(keys), args=list(args), client=redis)
                if replicas:
                    wait_for_replicas(redis, [keys[0]], replicas, wait_ms)
            results[i] = result

    if len(groups) == 1:
        run(*next(iter(groups.values())))
    else:
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            for future in [pool.submit(run, node, idx) for node, idx in groups.values()]:
                future.result()
    return results


def _pipelined(redis: Any, calls: list[Call], replicas: int, wait_ms: int,
               keep_errors: tuple[type[Exception], ...] = ()) -> list[Any]:
    pending = list(range(len(calls)))
    results: list[Any] = [None] * len(calls)
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        for i in pending:
            script, keys, args = calls[i]
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        if replicas:
            pipe.execute_command("WAIT", replicas, wait_ms)
        out = list(pipe.execute(raise_on_error=False))
        if replicas:
            _check(out.pop(), replicas)
        missing = []
        for i, result in zip(pending, out, strict=True):
            if isinstance(result, NoScriptError) and attempt == 1:
                missing.append(i)
            elif isinstance(result, Exception) and not isinstance(result, keep_errors):
                raise result
            else:
                results[i] = result
        if not missing:
            return results
        for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
            script.sha = redis.script_load(script.script)
        pending = missing
    return results


def wait_for_replicas(redis: Any, keys: Sequence[str], replicas: int, wait_ms: int) -> None:
    """WAIT until ``replicas`` replicas hold every write so far to the servers of ``keys``.

    A replication stream is ordered, so a harmless write in each key's slot followed by WAIT on
    the same connection proves that everything written there before, by anyone, has reached them.
    """
    nodes: dict[str, tuple[Any, list[str]]] = {}
    for key in keys:
        if isinstance(redis, RedisCluster):
            node = redis.get_node_from_key(key)  # type: ignore[no-untyped-call]
            nodes.setdefault(node.name, (redis.get_redis_connection(node), []))[1].append(key)
        else:
            nodes.setdefault("", (redis, []))[1].append(key)
    for client, node_keys in nodes.values():
        pipe = client.pipeline(transaction=False)
        for key in node_keys:
            # A marker key in the same slot; it expires at once, so nothing is left behind.
            pipe.set(keys_module.replication_marker(key), 1, px=1)
        pipe.execute_command("WAIT", replicas, wait_ms)
        _check(pipe.execute()[-1], replicas)


def _check(acknowledged: Any, wanted: int) -> None:
    if isinstance(acknowledged, Exception):
        raise acknowledged
    got = int(acknowledged)
    if got < wanted:
        raise NotReplicated(f"{got} of {wanted} replica(s) acknowledged the write in time")
