"""Every Redis key, channel, stream and queue name of sessionfork. This docstring is the key schema.

Session registry (may live on a Redis Cluster; every key of one session shares the hash tag
``{<id>}``, so each atomic step on a session touches one slot)::

    sf:s:{<id>}            hash   the session record
                                    header    [version, createdAt(, seedLength(, keptFrom))]
                                              (JSON; ``core.records``: the compact layout), or the
                                              header JSON (wire.Header: the old layout)
                                    cwd       the header's cwd (compact layout; only if set)
                                    parent    the parent's id (compact layout; only if forked)
                                    instance  live instance token; absent once disposed
                                    len       total events, inherited seed included
                                    seedlen   events inherited from the parent (seedLength)
                                    seed      JSON list of [ancestor id, start, stop): list indexes
                                              into that ancestor's own log, oldest ancestor first;
                                              [parent id, -b, -a] is a reference: events [a, b) of
                                              the parent's seed ([parent, -n, 0]: its first n; a
                                              child stores at most one and one slice; a forked
                                              session stores its seed by value); ["@<id>", 0, 1] is
                                              summary child <id>'s seq 0, its field summary
                                    summary   a summary child's session/summary event (stored JSON)
                                    last      type of the last event ("" for an empty log)
                                    lastend   seq of the newest turn/end, seed included (-1: none);
                                              absent on records written before turn indexes
                                    seedend   seq of the newest turn/end of the seed (-1: none)
                                    req       request id that created it by fork (for replays)
                                    mergedinto  its latest merge into an ancestor: JSON [parent id,
                                              the merge's first seq there, request id]
                                    abandoned the request id of the select that abandoned it
                                    plan:<holder>  "<fromSeq> <toSeq> <ms>": while a merge of this
                                              session runs, the range it resolved (merge_read.lua;
                                              a retry merges the same range) and its hold on it;
                                              the holder is the request id (a call without one: a
                                              token of its own, ".<hex>"); dropped when the request
                                              ends, ignored past the request window (lib/hold.lua)
                                    hold      "<holder> <ms>": while a select runs, its hold on each
                                              of its candidates (dropped and ignored as a plan)
                                    batch     id of the last append call, batchseq its first seq
                                              (a retried append is recognised, never doubled)
                                    imported  an imported session: the digest of its bundle
                                              (``ops.bundles``); importedfrom its id in the bundle
                                              when imported under a new id
                                    uin uout ucr ucw ucost  own usage: the sums of its appends'
                                              inputTokens, outputTokens, cacheReadTokens,
                                              cacheWriteTokens, costMicros (absent: 0)
                                    root      its tree's root (a child created on one server: its
                                              parent's root, or its parent when that is a root)
                                    tree      "1": a root (created without a parent)
                                    tin tout tcr tcw tcost  a root's tree totals: every append
                                              with usage in its tree adds to them (one server)
                                              the tombstone keeps the usage counters it has (and
                                              "tree" with a root's totals)
                                  once deleted, a tombstone (the id is never reused):
                                    deleted   when (epoch ms)
                                    parent, seed, seedlen, lastend, seedend, summary  kept
                                              while descendants pin the log (and the turn index);
                                              summary dropped once no descendant reads seq 0
                                    keptfrom  a summary child's keepFrom, kept while pinned (what
                                              its descendants read, mapped to its parent's seqs)
                                    freed     own-log positions replaced by placeholders: the
                                              prefix no descendant reads (summary children keep
                                              only their kept range: ``session_needs``)
    sf:s:{<id>}:log        list   the session's own events (seq >= seedlen), JSON without "seq"
    sf:s:{<id>}:persisted  string how many events the persistence backend holds durably (written by
                                  it; deletion with persisted_first waits for it to reach len)
    sf:s:{<id>}:flushasked string set (60 s TTL) when such a deletion asked the backend for a
                                  session/flush: asked once per interval, not per attempt
    sf:s:{<id>}:children   set    ids of the sessions forked from this one (lineage index); while
                                  it is not empty, the session's log is never freed (it pins it)
                                  but for what no child reads (``needs``)
    sf:s:{<id>}:needs      zset   the children of this session that read its log from a later seq
                                  than 0 (summary children), scored by that first seq (keepFrom;
                                  raised for a deleted child whose descendants read less); a
                                  child in ``children`` without an entry reads from seq 0. Once
                                  the session is deleted, the least over its children (0 if any
                                  has no entry) bounds what its descendants read: the own-log
                                  positions before it are freed (``freed``), and at or past its
                                  seedlen it is unpinned from its parent
    sf:s:{<id>}:merges     hash   merges into this session (merge.lua): ["m",child,fromSeq,toSeq] ->
                                  "<request id> <first seq> <length after>" (one merge of one range,
                                  under any request id: ALREADY_MERGED; request id "-": none); a
                                  select's candidates ["c",<id>] -> "m <request id> <first seq>" (its
                                  winner) or "a <request id>"; for the request window, each request
                                  id that merged here ["r",<request id>] -> "<first seq> <length
                                  after> <fromSeq> <toSeq> <ms>" (its retry answers this merge)
    sf:s:{<id>}:mergereqs  zset   the request ids of ``merges``' ["r",...] entries, scored by when
                                  (epoch ms): each merge drops a few past the request window
    sf:s:{<id>}:turns      list   turn index of the session's own events: 2*seq + 1 for each
                                  turn/end, 2*seq for each turn/start, ascending (append-only), so
                                  the newest marker at or before a seq is a binary search
    <key>:replicated       string a marker written (and expired within 1 ms) next to a key, in its
                                  slot, to WAIT for replicas after a replayed fork
    sf:lifecycle           stream session/created, session/flush, session/disposed, session/deleted
                                  for persistence backends (fields: type, id, len; session/deleted
                                  also header); capped (XADD MAXLEN ~)
    sf:ended               zset   branches that ended (merged or abandoned), scored by when (epoch ms,
                                  the first time): the retention sweep disposes them once
                                  SESSIONFORK_BRANCH_TTL has passed (on a cluster, written right after
                                  the mark)
    sf:disposed            zset   retention index: disposed session ids, scored by disposal time
                                  (epoch ms); one key (on a cluster, written right after dispose)
    sf:bundle:<digest>     hash   an import of a bundle (``ops.bundles``): state ("started", then
                                  "done"), ids (JSON: each bundle id's id here), under (the parent
                                  given, or ""): a second import of the same bundle is a no-op, a
                                  killed one resumes with the same ids

LangGraph checkpointer (``integrations.langgraph``; on the registry's connection, each key a slot of
its own on a cluster)::

    sf:lg:t:<thread id>    string the id of the session holding the thread's checkpoints (absent: none)
    sf:lg:threads          set    every thread id given a session (entries of deleted threads removed)
    sf:lg:run:<run id>     set    the thread ids with a checkpoint of that run (delete_for_runs)
    sf:lg:truns:<thread id> set   the run ids of the thread's checkpoints (a copy joins their sets)

Queue side (one Redis primary, the one RQ uses; never a cluster; a sharded queue: every shard's
server holds these for the request ids routed to it)::

    sf:req:<request id>    hash   idempotency record: digest, request (its identity JSON), planned
                                  child ids, then the outcome: one child's as child (its id) and
                                  its header's fields (header, cwd, parent: ``core.records``), any
                                  other as outcome (the reply JSON)
    sf:outcomes            stream every outcome, capped (XADD MAXLEN ~)
    sf:replies             channel default reply channel (requests may name their own)
    sf:shard               string "<index>/<count>" on each server of a sharded queue: which shard
                                  it is, written by its first worker (``queue.shard_check``)
    sf:audit               stream the console's actions on this server's queue (pause, resume): fields
                                  action, actor, detail; capped (XADD MAXLEN ~, ``ops.pauses``)
    sessionfork            RQ queue name; RQ derives its own keys from it (rq:queue:sessionfork,
                                  rq:job:<request id>, rq:queues ...), named for sessionfork's own
                                  use only in protocol/rq_layout.py; a paused shard is RQ's
                                  suspension key on its server (``rq:suspended``, what ``rq
                                  suspend`` sets: protocol/rq_layout.py, ``ops.pauses``)
"""

from __future__ import annotations

PREFIX = "sf"
DEFAULT_QUEUE = "sessionfork"
DEFAULT_REPLY_CHANNEL = f"{PREFIX}:replies"
OUTCOME_STREAM = f"{PREFIX}:outcomes"
LIFECYCLE_STREAM = f"{PREFIX}:lifecycle"
DISPOSED_INDEX = f"{PREFIX}:disposed"
ENDED_INDEX = f"{PREFIX}:ended"
SHARD_MARKER = f"{PREFIX}:shard"
AUDIT_STREAM = f"{PREFIX}:audit"
LANGGRAPH_THREADS = f"{PREFIX}:lg:threads"


def session(session_id: str) -> str:
    """The session record (hash)."""
    return f"{PREFIX}:s:{{{session_id}}}"


def session_log(session_id: str) -> str:
    """The session's own events (list)."""
    return f"{session(session_id)}:log"


def session_children(session_id: str) -> str:
    """Ids of the sessions forked from this one (set)."""
    return f"{session(session_id)}:children"


def session_needs(session_id: str) -> str:
    """The first seq of this session's log that each child reading less than all of it needs
    (zset: child id scored by its ``keepFrom``; a child without an entry needs it all)."""
    return f"{session(session_id)}:needs"


def session_persisted(session_id: str) -> str:
    """How many of the session's events the persistence backend holds durably (string)."""
    return f"{session(session_id)}:persisted"


def session_flush_asked(session_id: str) -> str:
    """Set while a ``session/flush`` asked by a deletion that waits for the backend is recent
    (string with a TTL): such flushes are asked once per interval, not once per attempt."""
    return f"{session(session_id)}:flushasked"


def session_merges(session_id: str) -> str:
    """The merges into this session: their ranges, request ids and select candidates (hash)."""
    return f"{session(session_id)}:merges"


def session_merge_requests(session_id: str) -> str:
    """The request ids that merged into this session within the request window, by when (zset)."""
    return f"{session(session_id)}:mergereqs"


def session_turns(session_id: str) -> str:
    """Turn index of the session's own events (list of ``2 * seq + (1 for turn/end)``)."""
    return f"{session(session_id)}:turns"


def langgraph_thread(thread_id: str) -> str:
    """The id of the session holding a LangGraph thread's checkpoints (string)."""
    return f"{PREFIX}:lg:t:{thread_id}"


def langgraph_run(run_id: str) -> str:
    """The LangGraph threads holding a checkpoint of one run (set)."""
    return f"{PREFIX}:lg:run:{run_id}"


def langgraph_thread_runs(thread_id: str) -> str:
    """The run ids of a LangGraph thread's checkpoints (set)."""
    return f"{PREFIX}:lg:truns:{thread_id}"


def bundle_import(digest: str) -> str:
    """The record of an import of the bundle whose digest is ``digest`` (hash)."""
    return f"{PREFIX}:bundle:{digest}"


def request(request_id: str) -> str:
    """The idempotency record of one fork request (hash, on the queue server)."""
    return f"{PREFIX}:req:{request_id}"


def replication_marker(key: str) -> str:
    """A throwaway key in ``key``'s slot (same hash tag), written before a WAIT."""
    return f"{key}:replicated"
