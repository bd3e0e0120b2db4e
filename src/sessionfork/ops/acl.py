"""Least-privilege Redis ACL users for the roles of a sessionfork deployment (Redis 7 syntax).

``acl_rules`` returns one ``ACL SETUSER`` command line per role; run each with an admin client
(``client.execute_command(*shlex.split(line))``) or pipe ``render(...)`` into ``redis-cli``. Each
line starts from nothing (``resetpass resetkeys resetchannels clearselectors -@all``) and then
grants exactly what the role's code paths send, so applying the rules again replaces a user's
permissions and password instead of adding to them. Passwords are stored as SHA-256 (``#<hex>``),
never in clear. The command sets were derived by running the whole flow (host, worker, scheduler,
refused jobs, retries, maintenance, shutdown) under these users until no ACL denial was logged.

``sf-scheduler`` (enqueues requests and reads replies; the queue server)
    * enqueue: ``FCALL sf_enqueue`` only (the project's enqueue script as a Redis Functions
      library, loaded by an admin with ``sessionfork load-functions``; ``protocol.enqueue``): a
      selector grants ``FCALL`` declaring ``rq:job:*``, ``rq:queue:<queue>``, ``sf:req:*`` and
      ``rq:queues`` (a declared key needs read and write access); the function's own commands
      (``TYPE``, ``EXISTS``, ``HGET``/``HMGET``, ``HSET``, ``RPUSH``, ``SADD``) are checked against
      the root rules, so ``sf:req:*`` stays read-only. No ``EVAL``, ``EVALSHA``, ``SCRIPT`` or
      ``FUNCTION``: the role cannot run code of its own (a long script would make the server
      answer ``BUSY`` to everyone).
    * replies: ``SUBSCRIBE`` to the reply channel ``<reply>`` and to per-request reply channels
      under the prefix ``<reply>:`` (a request's ``replyTo`` must use that prefix when schedulers
      run under this user); read-only ``HGET``/``HMGET`` of ``sf:req:*``; read-only
      ``XRANGE``/``XREAD`` of ``sf:outcomes`` (``sessionfork outcomes`` and ``stats``).
    * nothing else: no ``DEL``/``EXPIRE`` (it cannot delete or expire a job), no session key
      (``sf:s:*``), no registry script effect, no admin command.
    * residual (what key patterns cannot separate): it may ``HSET`` or ``HMGET`` any ``rq:job:*``
      hash and ``RPUSH`` to the queue (the function runs with the caller's permissions). A worker
      refuses every job but a fork request, so a rewritten job can at worst be another fork
      request; webhooks and callbacks written into a job hash are dropped when a worker loads it,
      and a job hash RQ cannot parse is refused (``INVALID_REQUEST``) without stopping the worker.

``sf-worker`` (``sessionfork worker``; the queue server and the registry)
    * RQ bookkeeping on ``rq:*``: job hashes, queue and intermediate queue (``BLMOVE``/``LMOVE``,
      ``LREM``), started/finished/failed registries (sorted sets), executions, results (streams),
      the worker's hash and sets, retries and abandoned jobs (``RPUSH``), transactions
      (``MULTI``/``EXEC``/``WATCH``; ``EVAL`` of the record script in the finish's transaction, and
      of a batch's bookkeeping scripts),
      ``SUBSCRIBE rq:pubsub:<worker>`` (RQ's command channel),
      ``CLIENT SETNAME``, ``CLIENT INFO`` (RQ 3 reads its own address there), ``INFO``.
      ``sessionfork health`` (which reads the worker registry) runs as this user too.
    * sessionfork: ``sf:req:*`` and ``sf:outcomes`` (claim and record scripts), ``PUBLISH`` to the
      reply channel and its ``<reply>:`` prefix, ``sf:s:*`` and ``sf:lifecycle`` (fork and merge
      scripts, children index), ``sf:disposed`` and ``sf:ended`` (retention, the branch TTL),
      ``sf:shard`` (the shard marker, read at start, written by a sharded queue's first worker);
      ``WAIT`` when ``wait_replicas`` is set.
    * no admin or dangerous command. ``CLIENT LIST`` is not granted on purpose: it shows every
      connection of the server; RQ 2 only uses it to learn its own address, and without it records
      ``ip_address = "unknown"`` (logging a warning at start-up).

``sf-host`` (an agent host: creates, appends, reads, forks, disposes and deletes sessions; the registry)
    * ``sf:s:*`` through the registry's scripts (``EVALSHA``/``SCRIPT LOAD``; the scripts run
      ``EXISTS``/``HGET``/``HMGET``/``HEXISTS``/``GET``/``HSET``/``HDEL``/``RPUSH``/``SADD``/
      ``SREM``/``SCARD``/``DEL``), reads (``HGET``/``HMGET``/``LRANGE``/``SMEMBERS``/``EXISTS``),
      ``XADD`` to ``sf:lifecycle``, ``ZADD``/``ZREM`` on the retention index ``sf:disposed`` and on
      the ended-branch index ``sf:ended`` (merges, selects, the branch TTL).
    * nothing on ``rq:*``, ``sf:req:*`` or ``sf:outcomes``, no channel.
    * residual: ACL key patterns cannot tell one host's sessions from another's; the instance
      token of a live handle is what keeps hosts apart.

``sf-persist`` (``sessionfork persist``; the registry)
    * read-only ``sf:s:*`` (``HGET``/``HMGET``/``HEXISTS``/``LRANGE``/``EXISTS``), except
      ``sf:s:{<id>}:persisted`` (``SET``/``DEL``: how many events it holds, for persist before
      evict); its consumer group on ``sf:lifecycle`` (``XGROUP CREATE``, ``XREADGROUP``, ``XACK``,
      ``XAUTOCLAIM``).

``sf-console`` (``sessionfork console``; the queue servers and the registry): read-only but the pause
    * reads: ``XRANGE``/``XREVRANGE``/``XREAD`` of ``sf:outcomes`` and ``sf:audit``; ``HGETALL``/
      ``HMGET``/``HGET`` of ``sf:req:*``; on ``rq:*`` what RQ's documented ``Worker.all`` and
      ``Job.fetch`` read (``SMEMBERS``, ``HGETALL``, ``HMGET``, ``EXISTS``, ``SCARD``, ``ZRANGE``...)
      and ``LLEN`` of the queue; ``sf:s:*`` read-only (``HGET``/``HMGET``/``SMEMBERS``/``EXISTS``:
      headers, lengths, the children index for lineage).
    * the one action: ``SET``/``DEL`` of RQ's suspension key ``rq:suspended`` (pause, resume) and
      ``XADD`` to the audit stream ``sf:audit``, in a transaction (``MULTI``/``EXEC``).
    * nothing else: it cannot enqueue, claim, record, fork, append, delete or expire anything.

With ``settings.cluster``, the host and the worker also get what redis-py's cluster client needs
to learn the topology (``CLUSTER SLOTS``, ``COMMAND``; checked against an embedded 3-node cluster).
Apply the same rules on the queue server and on the registry server when they differ.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping, Sequence

from ..core import keys
from ..core.config import Settings
from ..protocol import rq_layout as rq_layout

SCHEDULER = "sf-scheduler"
WORKER = "sf-worker"
HOST = "sf-host"
PERSIST = "sf-persist"
CONSOLE = "sf-console"
USERS = (SCHEDULER, WORKER, HOST, PERSIST, CONSOLE)

# Every role starts from nothing; order matters (a later rule adds to an earlier one).
_RESET = ("resetpass", "resetkeys", "resetchannels", "clearselectors", "-@all")
# What every connection of redis-py sends or may send (HELLO and AUTH need no grant).
_CONNECTION = ("ping", "client|setinfo")
_SCRIPTS = ("evalsha", "script|load")
_TRANSACTIONS = ("multi", "exec", "discard")
_CLUSTER = ("cluster|slots", "command")  # what redis-py's RedisCluster asks to learn the topology

_SCHEDULER_COMMANDS = (
    *_CONNECTION,
    "type", "exists", "hget", "hset", "rpush", "sadd",  # what the enqueue function runs
    "hmget", "subscribe", "unsubscribe",  # replies
    "xrange", "xread",  # the outcome stream
)
_WORKER_COMMANDS = (
    *_CONNECTION, *_SCRIPTS, *_TRANSACTIONS, "watch", "unwatch", "info", "client|setname", "client|info",
    "eval",  # the record scripts and a batch's RQ bookkeeping, their text (lua.add_loaded: never NOSCRIPT)
    "subscribe", "unsubscribe", "publish",
    "del", "exists", "expire", "get", "set",  # get/set: RQ's intermediate-queue "first seen" marks
    "hget", "hmget", "hgetall", "hexists", "hset", "hsetnx", "hdel", "hincrby", "hincrbyfloat",
    "blmove", "lmove", "lpop", "rpush", "lpush", "lrange", "lrem", "llen", "lindex",  # lmove: --burst; llen: queue
    # lpop: a batch's take (take.lua)
    # depth and, with lindex, the turn index of boundary forks;
    # lpush: a job stranded by a dead worker goes back to the queue's front
    "sadd", "srem", "smembers",
    "zadd", "zrem", "zscore", "zrange", "zrangebyscore", "zremrangebyscore",
    "xadd",
    "scard", "memory|usage",  # retention: deletion scripts, the sweep's bytes freed
    "sismember", "zcard", "ltrim",  # deletion: what a summary child's source frees (release.lua)
)
_HOST_COMMANDS = (
    *_CONNECTION, *_SCRIPTS,
    "exists", "hget", "hmget", "hset", "hdel", "rpush", "lrange", "smembers", "xadd",
    "hexists", "get", "sadd", "srem", "scard", "del", "zadd", "zrem",  # forks, dispose, delete (retention index)
    "llen", "lindex",  # boundary and summary forks: the turn index (snapshot.lua, turn.lua)
    "sismember", "zcard", "zscore", "zrange", "ltrim", "lpush",  # deletion: what a summary child's source frees
    "hincrby",  # an append's usage (append.lua: its own counters and its root's totals)
)
_CONSOLE_COMMANDS = (
    *_CONNECTION, *_TRANSACTIONS,
    "xrange", "xrevrange", "xread",  # the outcome and audit streams (the live view blocks in XREAD)
    "hgetall", "hget", "hmget", "exists", "smembers", "scard", "llen", "lrange", "zrange", "zcard", "type",
    "set", "del", "xadd",  # the pause and its audit entry: key rules allow them on those two keys only
)
_PERSIST_COMMANDS = (
    *_CONNECTION,
    "hget", "hmget", "lrange", "exists", "hexists",  # reading sessions
    "xgroup|create", "xreadgroup", "xack", "xautoclaim",  # the consumer group on the lifecycle stream
)


def _glob(literal: str) -> str:
    """``literal`` escaped for a Redis glob pattern (key and channel patterns are globs)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in literal)


def _line(user: str, password: str, key_rules: Sequence[str], channels: Sequence[str],
          commands: Sequence[str], selectors: Sequence[str] = ()) -> str:
    if not password:
        raise ValueError(f"empty password for ACL user {user}")
    digest = hashlib.sha256(password.encode()).hexdigest()
    tokens = ["ACL", "SETUSER", user, *_RESET, "on", f"#{digest}", *key_rules,
              *(f"&{c}" for c in channels), *(f"+{c}" for c in dict.fromkeys(commands)), *selectors]
    return shlex.join(tokens)


def acl_rules(settings: Settings, passwords: Mapping[str, str]) -> list[str]:
    """``ACL SETUSER`` lines for ``sf-scheduler``, ``sf-worker``, ``sf-host``, ``sf-persist`` and
    ``sf-console``.

    ``passwords`` maps each of the five user names to its (non-empty) password; a missing or
    empty one is a ``ValueError``. The queue name and reply channel come from ``settings``;
    ``settings.cluster`` and ``settings.wait_replicas`` add what those modes send. Each line is
    ``shlex``-quoted: ``shlex.split(line)`` gives the command's arguments.
    """
    missing = [u for u in USERS if u not in passwords]
    if missing:
        raise ValueError(f"no password for ACL user(s) {', '.join(missing)}")
    queue = _glob(settings.queue)
    reply = _glob(settings.reply_channel)
    replies = (reply, f"{reply}:*")
    cluster = _CLUSTER if settings.cluster else ()
    wait = ("wait",) if settings.wait_replicas else ()
    # A script's declared keys need read and write access whatever the script does with them,
    # so keys passed to a script (rq:queue:<queue>, sf:lifecycle) cannot be write-only.
    sessions = (f"~{keys.PREFIX}:s:*", f"~{_glob(keys.LIFECYCLE_STREAM)}", f"~{_glob(keys.DISPOSED_INDEX)}",
                f"~{_glob(keys.ENDED_INDEX)}")
    rq = rq_layout.key_patterns(queue)
    # The enqueue function declares sf:req:<id> (it reads the request kept there), and a
    # function's declared keys need write access: a selector grants it for FCALL only, whose
    # commands are checked against the root rules (read-only there): no HSET of an outcome.
    enqueue = f"(~{rq['jobs']} ~{rq['queue']} ~{keys.PREFIX}:req:* ~{rq['queues']} +fcall)"
    scheduler = _line(
        SCHEDULER, passwords[SCHEDULER],
        [f"~{rq['jobs']}", f"~{rq['queue']}", f"~{rq['queues']}",
         f"%R~{keys.PREFIX}:req:*", f"%R~{_glob(keys.OUTCOME_STREAM)}", enqueue],
        replies, _SCHEDULER_COMMANDS)
    worker = _line(
        WORKER, passwords[WORKER],
        [f"~{rq['all']}", f"~{keys.PREFIX}:req:*", f"~{_glob(keys.OUTCOME_STREAM)}",
         f"~{keys.PREFIX}:s:*", f"~{_glob(keys.LIFECYCLE_STREAM)}", f"~{_glob(keys.DISPOSED_INDEX)}",
         f"~{_glob(keys.ENDED_INDEX)}", f"~{_glob(keys.SHARD_MARKER)}"],
        [rq["worker_channels"], *replies], (*_WORKER_COMMANDS, *cluster, *wait))
    host = _line(HOST, passwords[HOST], sessions, (), (*_HOST_COMMANDS, *cluster))
    # XREADGROUP and XACK write the group's state, so the stream needs write access too.
    # A selector: SET and DEL on the "persisted" marks only (persist before evict), nothing else.
    persist = _line(PERSIST, passwords[PERSIST], [f"%R~{keys.PREFIX}:s:*", f"~{_glob(keys.LIFECYCLE_STREAM)}"],
                    (), (*_PERSIST_COMMANDS, *cluster), [f"(~{keys.PREFIX}:s:*:persisted +set +del)"])
    # Read-only everywhere (%R~), but the suspension key and the audit stream (read and write).
    console = _line(CONSOLE, passwords[CONSOLE],
                    [f"%R~{rq['all']}", f"%R~{keys.PREFIX}:req:*", f"%R~{_glob(keys.OUTCOME_STREAM)}",
                     f"%R~{keys.PREFIX}:s:*", f"~{_glob(rq_layout.SUSPENDED)}", f"~{_glob(keys.AUDIT_STREAM)}"],
                    (), (*_CONSOLE_COMMANDS, *cluster))
    return [scheduler, worker, host, persist, console]


def render(lines: Sequence[str]) -> str:
    """The lines as one text, one command per line, ready to pipe into ``redis-cli``."""
    return "".join(f"{line}\n" for line in lines)
