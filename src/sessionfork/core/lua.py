"""The Lua scripts (``scripts/*.lua``), registered once per client, and how to run them in bulk.

``SCRIPTS`` is the one table of scripts, by name: each ``Spec`` names its ``KEYS`` and ``ARGV`` in
order, and ``Scripts(redis).op(name, **named)`` (or calling it) builds them from keyword
arguments, so no call site spells an argument by position. Scripts take key names only from
``KEYS``. ``run`` sends script calls and plain commands in one
pipelined round trip: EVALSHA, without redis-py's per-pipeline SCRIPT EXISTS round trip. This is
sessionfork's one NOSCRIPT strategy: a NOSCRIPT (the server restarted or was flushed) loads the
script and re-runs the calls that got it (they did not run). ``eval_many`` runs script calls on a
server or a cluster: on a cluster, the calls are grouped by the node that owns their first key
and each group is pipelined (``run``) on that node's own connection; a call that meets a
redirection (MOVED, ASK: a failover or a resharding) is re-run through the cluster client, as is
a fork's single source step (redis-py's cluster client follows a new topology, and loads a
script it misses, itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Final

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError, TryAgainError

from ..core import keys as keys_module

Call = tuple[Script, Sequence[str], Sequence[Any]]
"""A script call: the script, its keys, its arguments."""
Op = Call | tuple[str, ...]
"""A script call, or a plain command as its words (``("HMGET", key, "header")``)."""
_REDIRECTED = (MovedError, AskError, TryAgainError, ClusterDownError)


@dataclass(frozen=True, slots=True)
class Spec:
    """A script's calling contract: ``scripts/<name>.lua`` of ``package`` (the owning module's
    ``__package__``; ``None``: the session core's), its KEYS and ARGV by name.

    A name ending in ``?`` is optional (``None``: left out; only trailing ones may be left out,
    since Lua reads them by position); one ending in ``*`` (the last argument) takes a sequence.
    """

    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    package: str | None = None
    # The names parsed once (bare name, optional, a sequence), not on every call: a fan-out builds
    # one create call per child, and parsing 25 names each time was most of its Python cost.
    _plan: tuple[tuple[tuple[str, bool, bool], ...], tuple[tuple[str, bool, bool], ...]] = field(
        init=False, repr=False, compare=False)
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        plan = tuple(tuple((n.rstrip("?*"), n.endswith(("?", "*")), n.endswith("*")) for n in names)
                     for names in (self.keys, self.args))
        object.__setattr__(self, "_plan", plan)
        object.__setattr__(self, "_names", frozenset(bare for part in plan for bare, _, _ in part))

    def build(self, named: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
        """The script's KEYS and ARGV from ``named`` (bare names); ``TypeError`` for a missing,
        unknown or misplaced one (a programming error)."""
        unknown = named.keys() - self._names
        if unknown:
            raise TypeError(f"{self.name}.lua takes no {', '.join(sorted(unknown))}")
        return self._fill(self._plan[0], named), self._fill(self._plan[1], named)

    def build_each(self, shared: Mapping[str, Any],
                   each: Sequence[Mapping[str, Any]]) -> list[tuple[list[Any], list[Any]]]:
        """``build({**shared, **item})`` for each item of ``each``, built as one: the names are
        checked and ``shared``'s values placed once, then each item's values put in their places
        (the children of a fan-out differ in a few of the create script's names). An item naming
        other names than the first, or a ``None`` (a left-out name), is built on its own."""
        if len(each) < 2:  # one item: its own build is the cheaper (no template to build and copy)
            return [self.build({**shared, **item}) for item in each]
        varying = each[0].keys()
        star = next((bare for bare, _, many in self._plan[1] if many and bare in varying), None)
        keys_t, args_t = self.build({**shared, **{n: None if n == star else _Slot(n) for n in varying}})
        key_slots = [(i, v.name) for i, v in enumerate(keys_t) if isinstance(v, _Slot)]
        arg_slots = [(i, v.name) for i, v in enumerate(args_t) if isinstance(v, _Slot)]
        out: list[tuple[list[Any], list[Any]]] = []
        for item in each:
            if item.keys() != varying or None in item.values():
                out.append(self.build({**shared, **item}))
                continue
            call_keys, args = keys_t.copy(), args_t.copy()
            for i, name in key_slots:
                call_keys[i] = item[name]
            for i, name in arg_slots:
                args[i] = item[name]
            if star is not None:
                args.extend(item[star])
            out.append((call_keys, args))
        return out

    def _fill(self, plan: tuple[tuple[str, bool, bool], ...], named: Mapping[str, Any]) -> list[Any]:
        out: list[Any] = []
        left_out = ""
        for bare, optional, many in plan:
            value = named.get(bare)
            if value is None:
                if not optional:
                    raise TypeError(f"{self.name}.lua needs {bare}")
                left_out = bare
                continue
            if left_out:
                raise TypeError(f"{self.name}.lua: {bare} given after {left_out} was left out")
            if many:
                out.extend(value)
            else:
                out.append(value)
        return out


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where ``Spec.build_each`` puts an item's value of ``name``."""

    name: str


SCRIPTS: Final[Mapping[str, Spec]] = {spec.name: spec for spec in (
    Spec("append", ("record", "log", "turns", "lifecycle?", "tree?"),
         ("instance", "last_type", "expect_length", "flush", "maxlen", "session_id", "call_id", "markers", "usage",
          "root", "events*")),
    Spec("create", ("record", "log", "turns", "lifecycle?", "parent_children?", "parent?", "parent_needs?"),
         ("header", "instance", "length", "seed_length", "seed", "last_type", "request_id", "maxlen", "session_id",
          "seed_end", "parent_header", "last_end", "markers", "summary", "need", "cwd", "parent_id", "parent_stored",
          "parent_cwd", "parent_parent", "edits*")),
    Spec("create_many", ("lifecycle", "parent_children", "parent", "children*"),
         ("header", "length", "seed_length", "seed", "last_type", "request_id", "maxlen", "seed_end", "parent_header",
          "last_end", "markers", "summary", "need", "cwd", "parent_id", "parent_stored", "parent_cwd", "parent_parent",
          "each*")),
    Spec("delete", ("record", "log", "children", "persisted", "turns", "lifecycle?"),
         ("now", "maxlen", "session_id", "only_disposed", "persisted_first")),
    Spec("dispose", ("record", "lifecycle?", "disposed?"), ("instance", "maxlen", "session_id", "now")),
    Spec("flush", ("asked", "lifecycle?"), ("interval", "maxlen", "session_id", "length")),
    Spec("hold", ("record",), ("holder", "now", "window", "session_id")),
    Spec("mark", ("record", "ended?"), ("kind", "value", "now", "session_id", "holder")),
    Spec("mark_many", ("ended", "records*"), ("kind", "value", "now", "holder", "session_ids*")),
    Spec("merge", ("record", "log", "turns", "merges", "requests", "lifecycle?"),
         ("instance", "if_length", "request_id", "merge_key", "child", "others", "maxlen", "session_id",
          "request_key", "from_seq", "to_seq", "now", "window", "events*")),
    Spec("merge_read", ("record", "turns", "log", "others*"),
         ("if_length", "from_seq", "to_seq", "most", "events", "most_bytes", "holder", "now", "window", "select",
          "session_id", "other_ids*")),
    Spec("pin", ("record", "children", "needs"), ("need", "child_ids*")),
    Spec("release", ("record", "log", "children", "turns", "needs"), ("child", "need")),
    Spec("settle", ("record",), ("seed",)),
    Spec("subtree", ("level*",), ()),
    Spec("snapshot", ("record", "turns", "log"), ("instance", "boundary", "if_length", "keep", "session_id")),
    Spec("turn", ("record", "turns", "log"), ("index",)),
    Spec("unhold", ("records*",), ("holder",)),
)}
"""The session core's Lua scripts, by name. The other layers' scripts are tables of their own
(``worker.outcomes.SCRIPTS``: claim, record; ``protocol.enqueue.SPEC``), each naming its own package."""


def table(*specs: Spec) -> Mapping[str, Spec]:
    """A table of scripts by name, as ``Scripts`` takes it."""
    return {spec.name: spec for spec in specs}


class Scripts:
    """The scripts of ``table`` (default: the core's ``SCRIPTS``) for one client (``redis``):
    registered on first use, called by name."""

    def __init__(self, redis: Any, scripts: Mapping[str, Spec] | None = None) -> None:
        self.redis = redis
        self.specs = SCRIPTS if scripts is None else scripts
        self._registered: dict[str, Script] = {}

    def script(self, name: str) -> Script:
        if name not in self._registered:
            spec = self.specs[name]
            self._registered[name] = register(self.redis, f"{spec.name}.lua", spec.package)
        return self._registered[name]

    def op(self, name: str, /, **named: Any) -> Call:
        """The call of script ``name`` with ``named`` keys and arguments, for ``run``/``eval_many``."""
        call_keys, args = self.specs[name].build(named)
        return self.script(name), call_keys, args

    def op_each(self, name: str, shared: Mapping[str, Any], each: Sequence[Mapping[str, Any]]) -> list[Call]:
        """``op(name, **shared, **item)`` for each item of ``each`` (``Spec.build_each``)."""
        script = self.script(name)
        return [(script, call_keys, args) for call_keys, args in self.specs[name].build_each(shared, each)]

    def __call__(self, name: str, /, **named: Any) -> Any:
        """Run script ``name`` now (EVALSHA, loading it on NOSCRIPT) with ``named`` keys and arguments."""
        script, call_keys, args = self.op(name, **named)
        return script(keys=list(call_keys), args=list(args))


INCLUDE: Final = "--#include "
"""A script line ``--#include lib/<name>.lua`` stands for that file of the core's ``scripts/``
(helpers shared by scripts: ``lib/header.lua``, ``lib/turns.lua``); ``source`` expands it."""


def source(name: str, package: str | None = None) -> str:
    """The text of ``scripts/<name>`` in ``package`` (default: this one, the session core's), its
    ``INCLUDE`` lines expanded."""
    text = resources.files(package or __package__).joinpath("scripts", name).read_text(encoding="utf-8")
    return "".join(source(line[len(INCLUDE):].strip()) if line.startswith(INCLUDE) else line
                   for line in text.splitlines(keepends=True))


def register(redis: Any, name: str, package: str | None = None) -> Script:
    """Register ``scripts/<name>`` of ``package`` with ``redis`` (SHA computed locally; loaded on
    demand), its text without its comment lines (``compact``)."""
    script: Script = redis.register_script(compact(source(name, package)))
    return script


def compact(text: str) -> str:
    """A script's text without its blank lines and the lines that are only a comment: the text a
    worker sends with every ``EVAL`` (``add_loaded``), which the server reads and hashes each time,
    and which fits a pipeline's first write where the commented text took two. No script uses long
    brackets (``[[``), so a line starting ``--`` is a whole comment."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if line.strip() and not line.lstrip().startswith("--"))


class NotReplicated(Exception):
    """WAIT saw fewer replicas acknowledge a write than asked; the write stands on the primary.

    Raised so that the request is retried (it is idempotent): the retry writes and waits again.
    """


def eval_many(redis: Any, calls: Sequence[Call], *, replicas: int = 0, wait_ms: int = 1000,
              in_order: bool = False) -> list[Any]:
    """Results of ``calls`` in order: one round trip per server involved.

    With ``replicas``, each server's batch ends with WAIT on the same connection, and
    ``NotReplicated`` is raised when fewer replicas acknowledged the writes within ``wait_ms``.
    ``in_order``: the calls of each server run in the order given, whatever the server's script
    cache (each sent as ``EVAL`` of its text: a NOSCRIPT re-run would come after the calls that
    followed it).
    """
    if not calls:
        return []
    if not isinstance(redis, RedisCluster):
        return run(redis, calls, replicas=replicas, wait_ms=wait_ms, in_order=in_order)
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, (_, keys, _) in enumerate(calls):
        node = redis.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
        groups.setdefault(node.name, (node, []))[1].append(i)
    results: list[Any] = [None] * len(calls)

    def run_group(node: Any, indexes: list[int]) -> None:
        client = redis.get_redis_connection(node)
        batch = run(client, [calls[i] for i in indexes], replicas=replicas, wait_ms=wait_ms, keep_errors=_REDIRECTED,
                    in_order=in_order)
        for i, result in zip(indexes, batch, strict=True):
            if isinstance(result, _REDIRECTED):
                script, keys, args = calls[i]
                result = script(keys=list(keys), args=list(args), client=redis)
                if replicas:
                    wait_for_replicas(redis, [keys[0]], replicas, wait_ms)
            results[i] = result

    if len(groups) == 1:
        run_group(*next(iter(groups.values())))
    else:
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            for future in [pool.submit(run_group, node, idx) for node, idx in groups.values()]:
                future.result()
    return results


def run(redis: Any, ops: Sequence[Op], *, replicas: int = 0, wait_ms: int = 1000,
        keep_errors: tuple[type[Exception], ...] = (), in_order: bool = False) -> list[Any]:
    """Results of ``ops`` on one server, in order, in one pipelined round trip (two after a NOSCRIPT).

    An error reply raises, unless it is one of ``keep_errors`` (then it is the op's result). With
    ``replicas``, the batch ends with WAIT on the same connection (``NotReplicated`` when fewer
    replicas acknowledged within ``wait_ms``). ``in_order``: script calls sent as ``EVAL`` of their
    text (``add_loaded``), never NOSCRIPT, so none re-runs after the ops that followed it.
    """
    pipe = redis.pipeline(transaction=False)
    add(pipe, ops, loaded=in_order)
    if replicas:
        pipe.execute_command("WAIT", replicas, wait_ms)
    out = list(pipe.execute(raise_on_error=False))
    waited = out.pop() if replicas else None
    # The calls that got NOSCRIPT run first (their own WAIT after them): every write stands on the
    # primary before a short WAIT is reported, as it would had the scripts been loaded.
    results = settle(redis, ops, out, keep_errors=keep_errors, replicas=replicas, wait_ms=wait_ms)
    if replicas:
        _check(waited, replicas)
    return results


def add(pipe: Any, ops: Sequence[Op], *, loaded: bool = False) -> None:
    """Put ``ops`` in ``pipe`` (a pipeline without a transaction): script calls as EVALSHA,
    without redis-py's per-pipeline SCRIPT EXISTS round trip (``loaded``: as ``EVAL`` of their
    text, ``add_loaded``); a caller composing a round trip of its own adds its commands around them
    and hands their replies to ``settle``."""
    for op in ops:
        if isinstance(op[0], Script) and loaded:
            add_loaded(pipe, op)
        elif isinstance(op[0], Script):
            script, keys, args = op
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        else:
            pipe.execute_command(*op)


def settle(redis: Any, ops: Sequence[Op], replies: Sequence[Any], *,
           keep_errors: tuple[type[Exception], ...] = (), replicas: int = 0, wait_ms: int = 1000) -> list[Any]:
    """The results of ``ops`` from their ``replies`` (``add``'s, in order): the calls that got
    NOSCRIPT (the server restarted or was flushed: they did not run) re-run once on ``redis``
    after loading their scripts (with ``replicas``: their WAIT too). An error reply raises, unless
    it is one of ``keep_errors``."""
    results = list(replies)
    missing = [i for i, reply in enumerate(results) if isinstance(reply, NoScriptError)]
    if missing:
        for script in {id(s): s for s in (ops[i][0] for i in missing) if isinstance(s, Script)}.values():
            script.sha = redis.script_load(script.script)
        pipe = redis.pipeline(transaction=False)
        add(pipe, [ops[i] for i in missing])
        if replicas:
            pipe.execute_command("WAIT", replicas, wait_ms)
        again = list(pipe.execute(raise_on_error=False))
        if replicas:
            _check(again.pop(), replicas)
        for i, reply in zip(missing, again, strict=True):
            results[i] = reply
    for reply in results:
        if isinstance(reply, Exception) and not isinstance(reply, keep_errors):
            raise reply
    return results


def add_loaded(pipe: Any, call: Call) -> None:
    """Put ``call`` in ``pipe`` as an EVAL of the script's text, not an EVALSHA: it never meets
    NOSCRIPT (a server that lost its scripts: restarted, flushed). In a transaction a NOSCRIPT
    would fail the call alone, and EXEC would still run the commands around it; in a pipeline
    those commands would run too (one command, where SCRIPT LOAD + EVALSHA take two)."""
    script, call_keys, args = call
    pipe.eval(script.script, len(call_keys), *call_keys, *args)


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
