"""What the console shows, read from Redis: plain values for its templates (no HTML here).

Every function takes the clients it reads (the queue servers in shard order, the registry) and
sends only reads, but for ``ops.pauses`` (the one action). Ids, messages and event data come back
as they are stored: escaping is the templates' (Jinja2's autoescape) and the page script's
(``textContent``), never a concern of these reads.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import msgspec
from msgspec import UNSET

from ..core import errors, keys, rules, wire
from ..core.registry import Registry
from ..core.wire import ForkResult, MergeResult, SelectResult
from ..ops import lineage, pauses
from ..ops.stats import Outcome, outcome_of
from ..protocol import operations
from ..protocol.outcomes import stream_entry
from ..protocol.shards import shard_of
from ..worker.jobs import WorkerRow, queued_request, worker_rows

_pretty = msgspec.json.Decoder()


class Row(msgspec.Struct, rename="camel", kw_only=True):
    """One outcome as the live view shows it (the event stream's ``data``, JSON)."""

    id: str
    time: int
    shard: int
    request_id: str
    op: str
    code: str
    source: str
    detail: str
    duration_ms: float
    latency_ms: float


def op_of(reply: wire.Outcome) -> str:
    """The name of the operation a reply answers (``protocol.operations``' table)."""
    return operations.of_reply(reply).name


def source_of(reply: wire.Outcome) -> str:
    """The session a result read from: a fork's source, a merge's or a select's merged child
    ("" for a failure: its request may not name a valid one)."""
    if isinstance(reply, ForkResult):
        if reply.session is not UNSET and reply.session.parent_session is not UNSET:
            return reply.session.parent_session
        if reply.sessions is not UNSET and reply.sessions and reply.sessions[0].parent_session is not UNSET:
            return reply.sessions[0].parent_session
    if isinstance(reply, MergeResult | SelectResult):
        return reply.merged_from.session
    return ""


def detail_of(reply: wire.Outcome) -> str:
    """One line of what a reply did: the children made, the range merged, or the error's message."""
    if isinstance(reply, ForkResult):
        if reply.session is not UNSET:
            return reply.session.id
        return ", ".join(s.id for s in reply.sessions or [])
    if isinstance(reply, MergeResult | SelectResult):
        merged = reply.merged_from
        text = f"{merged.session} [{merged.from_seq}-{merged.to_seq}] into {reply.parent} at seq {reply.from_seq}"
        return text + (f"; abandoned {', '.join(reply.abandoned)}" if isinstance(reply, SelectResult) else "")
    return reply.message


def row_of(outcome: Outcome, shard: int) -> Row:
    reply = outcome.reply
    return Row(id=outcome.id, time=outcome.time, shard=shard, request_id=outcome.request_id, op=op_of(reply),
               code=outcome.code, source=source_of(reply), detail=detail_of(reply),
               duration_ms=outcome.duration_us / 1000, latency_ms=outcome.latency_us / 1000)


class Filter(msgspec.Struct, kw_only=True):
    """The live view's filter: each field empty (anything) or the exact value a row must carry;
    ``errors``: only the rows whose code is not ``OK``."""

    code: str = ""
    op: str = ""
    source: str = ""
    errors: bool = False

    def keeps(self, row: Row) -> bool:
        return (not (self.errors and row.code == "OK")
                and all(not want or want == got for want, got in
                        ((self.code, row.code), (self.op, row.op), (self.source, row.source))))

    def scope(self) -> Filter:
        """What the window's counts and chart cover: this filter's op and source, every code."""
        return Filter(op=self.op, source=self.source)


def recent(shards: Sequence[Any], keep: Filter, count: int = 50) -> list[Row]:
    """The newest ``count`` outcomes of every shard that ``keep`` keeps, newest first (each
    shard's newest ``4 * count`` entries looked at when filtering)."""
    rows: list[Row] = []
    for index, redis in enumerate(shards):
        entries = redis.xrevrange(keys.OUTCOME_STREAM, count=count if keep == Filter() else count * 4)
        rows += [row_of(outcome_of(wire.text(eid), fields), index) for eid, fields in entries]
    rows = [r for r in rows if keep.keeps(r)]
    rows.sort(key=lambda r: (r.time, r.id), reverse=True)
    return rows[:count]


def newest_ids(shards: Sequence[Any]) -> list[str]:
    """Each shard's newest outcome entry id (``0-0``: none): where a live stream starts."""
    out = []
    for redis in shards:
        newest = redis.xrevrange(keys.OUTCOME_STREAM, count=1)
        out.append(wire.text(newest[0][0]) if newest else "0-0")
    return out


def following(shards: Sequence[Any], last: list[str], block_ms: int) -> list[Row]:
    """The outcomes stored after ``last`` (one entry id per shard, advanced in place), oldest
    first; each shard's read blocks at most ``block_ms / len(shards)``."""
    rows = []
    block = max(1, block_ms // max(len(shards), 1))
    for index, redis in enumerate(shards):
        for _, entries in redis.xread({keys.OUTCOME_STREAM: last[index]}, block=block, count=500) or []:
            for entry_id, fields in entries:
                last[index] = wire.text(entry_id)
                rows.append(row_of(outcome_of(last[index], fields), index))
    return rows


class CodeStats(msgspec.Struct, rename="camel", kw_only=True):
    """Per outcome code over the window: how many, their rate (per second) and share of every
    outcome (percent), and enqueue-to-outcome latency percentiles (ms)."""

    code: str
    count: int
    rate: float
    share: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None


BUCKETS = 60
"""How many bars the live overview's chart draws over its window."""


class Window(msgspec.Struct, rename="camel", kw_only=True):
    """The outcomes of the last ``seconds`` (those ``Filter.scope`` keeps), for the live overview:
    per code, and per code and bucket of ``step`` ms from ``start`` (epoch ms; ``BUCKETS``
    buckets, the last one holding ``now``), which the page's script carries on live."""

    seconds: int
    now: int
    start: int
    step: int
    buckets: int
    total: int
    errors: int
    codes: list[CodeStats]
    series: dict[str, list[int]]
    """Per code, the outcomes of each bucket, oldest first."""
    since: int = 0
    """When a shard had more than ``WINDOW_MOST`` outcomes in the window: the time (epoch ms) from
    which every shard's were counted (0: the whole window was)."""

    @property
    def error_share(self) -> float:
        """Errors (every code but ``OK``) as a percent of every outcome (0: none)."""
        return 100.0 * self.errors / self.total if self.total else 0.0


WINDOW_MOST = 20_000
"""The most outcomes of one shard a window counts (its newest): a page's reads stay within its bound."""


def window(shards: Sequence[Any], seconds: int, now_ms: int, keep: Filter | None = None,
           most: int = WINDOW_MOST) -> Window:
    """The window of the last ``seconds`` to ``now_ms``, every shard, the outcomes ``keep`` keeps
    (its op and source: ``Filter.scope``), at most each shard's newest ``most`` (``Window.since``
    then says from when it counted). A reply is decoded only for a source to compare."""
    step = seconds * 1000 // BUCKETS
    start = (now_ms // step + 1) * step - BUCKETS * step
    keep = keep or Filter()
    samples: dict[str, list[float]] = defaultdict(list)
    series: dict[str, list[int]] = {}
    since = 0
    for redis in shards:
        read = 0
        for entry_id, fields in _newest(redis, f"{start}-0", most):
            read += 1
            when = int(wire.text(entry_id).split("-")[0])
            if read == most:
                since = max(since, when)
            f: dict[bytes, Any] = fields if b"latencyUs" in fields else \
                {name.encode(): value for name, value in stream_entry(fields).items()}  # older names, or text
            code, reply = wire.text(f[b"code"]), f[b"reply"]
            if keep.op and _op(reply) != keep.op:
                continue
            if keep.source and source_of(wire.decode_reply(reply)) != keep.source:
                continue
            series.setdefault(code, [0] * BUCKETS)[min(max((when - start) // step, 0), BUCKETS - 1)] += 1
            latency = int(f[b"latencyUs"])
            if latency:
                samples[code].append(latency / 1000)
    counts = {code: sum(per) for code, per in series.items()}
    total = sum(counts.values())
    codes = [CodeStats(code=code, count=counts[code], rate=counts[code] / seconds, share=100.0 * counts[code] / total,
                       **_percentiles(samples[code])) for code in sorted(counts)]
    return Window(seconds=seconds, now=now_ms, start=start, step=step, buckets=BUCKETS, total=total,
                  errors=total - counts.get("OK", 0), codes=codes, series=series, since=since)


def _newest(redis: Any, start: str, most: int, batch: int = 2000) -> Iterator[tuple[Any, Any]]:
    """The outcome stream's entries from the newest back to ``start``, at most ``most``."""
    high, left = "+", most
    while left > 0:
        entries = redis.xrevrange(keys.OUTCOME_STREAM, max=high, min=start, count=min(batch, left))
        yield from entries
        left -= len(entries)
        if len(entries) < batch:
            return
        high = f"({wire.text(entries[-1][0])}"


_OP_OF_TYPE = {b"fork/": "fork", b"merge": "merge", b"selec": "select"}


def _op(reply: bytes) -> str:
    """The operation of an encoded reply, read from its leading ``type`` (decoded when it is not there)."""
    if reply.startswith(b'{"type":"'):
        found = _OP_OF_TYPE.get(reply[9:14])
        if found:
            return found
    return op_of(wire.decode_reply(reply))


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if len(values) >= 2:
        q = statistics.quantiles(values, n=100, method="inclusive")
        return {"p50_ms": q[49], "p90_ms": q[89], "p99_ms": q[98]}
    one = values[0] if values else None
    return {"p50_ms": one, "p90_ms": one, "p99_ms": one}


class RequestView(msgspec.Struct, kw_only=True):
    """A request found by id, as an operator reads it: where it is, what it asked, when it was
    enqueued, started and answered, by which worker, in how many attempts, and what it answered.

    Times are epoch milliseconds (0: not known, or not yet). RQ's job (kept ``result_ttl`` after
    its end) gives the times and the worker; once it is gone, the request's outcome stream entry
    (among each shard's newest ``SCAN_OUTCOMES``) gives the answer's time, run time and latency."""

    request_id: str
    shard: int
    routed_shard: int
    status: str
    """``queued``, ``running`` (claimed, not answered) or ``answered``."""
    op: str
    """``fork``, ``merge`` or ``select`` ("": not known)."""
    asked: list[tuple[str, str]]
    """The request's fields as the scheduler sent them, each value as compact JSON ([]: RQ's job is gone)."""
    enqueued: int = 0
    started: int = 0
    answered: int = 0
    worker: str = ""
    attempts: int = 0
    """Runs of the job so far (0: not known or not started)."""
    run_ms: float | None = None
    """The last run's time, start to outcome."""
    latency_ms: float | None = None
    """Enqueue to outcome."""
    code: str = ""
    message: str = ""
    """A failure's error message."""
    children: list[str] = msgspec.field(default_factory=list)
    """The sessions a fork made (planned, while it runs); a merge's or select's parent and merged child."""
    merged: str = ""
    """A merge's or select's range, in words."""
    abandoned: list[str] = msgspec.field(default_factory=list)
    reply: str = ""
    """The reply JSON, for reading as it is."""


SCAN_OUTCOMES = 2000
"""How many of a shard's newest outcome entries a request page looks through for the request's."""

_JOB_FIELDS = ("status", "enqueued_at", "started_at", "ended_at", "worker_name", "retries_left")


def find_request(shards: Sequence[Any], request_id: str, settings: Any) -> RequestView | None:
    """The request ``request_id`` on whichever shard holds it (its record, else its queued job)."""
    from ..protocol import rq_layout

    if not rules.is_valid_id(request_id):
        return None
    routed = shard_of(request_id, len(shards))
    for index in [routed, *(i for i in range(len(shards)) if i != routed)]:
        redis = shards[index]
        record = {wire.text(k): v for k, v in redis.hgetall(keys.request(request_id)).items()}
        job = dict(zip(_JOB_FIELDS, (None if v is None else wire.text(v) for v in
                                     redis.hmget(rq_layout.job_key(request_id), _JOB_FIELDS)), strict=True))
        queued = queued_request(redis, request_id) if job["status"] is not None else None
        if not record and queued is None:
            continue
        view = RequestView(request_id=request_id, shard=index, routed_shard=routed,
                           status="queued" if not record else "running", op="", asked=[])
        if queued is not None:
            view.asked, view.op = _asked(queued[1])
        _timeline(view, job, settings)
        if record:
            _answer(view, record)
        if view.status == "answered" and not view.answered:  # RQ's job is gone
            _from_stream(view, redis)
        return view
    return None


def _asked(payload: str) -> tuple[list[tuple[str, str]], str]:
    try:
        fields = _pretty.decode(payload)
    except msgspec.DecodeError:
        return [("request", payload)], ""
    if not isinstance(fields, dict):
        return [("request", payload)], ""
    op = str(fields.get("op", "fork"))
    return [(str(k), wire.text(msgspec.json.encode(v))) for k, v in fields.items() if k != "requestId"], op


def _timeline(view: RequestView, job: dict[str, str | None], settings: Any) -> None:
    view.enqueued, view.started, ended = (_rq_time(job[f]) for f in ("enqueued_at", "started_at", "ended_at"))
    view.worker = job["worker_name"] or ""
    if view.started:
        left = job["retries_left"]
        view.attempts = max(1, int(settings.retries) - int(left) + 1) if left and left.isdigit() else 1
    if job["status"] == "started":
        view.status = "running"
    if ended and view.started:
        view.answered = ended
        view.run_ms = float(ended - view.started)
    if ended and view.enqueued:
        view.latency_ms = float(ended - view.enqueued)


def _rq_time(text: str | None) -> int:
    """An RQ timestamp (``2026-01-02T03:04:05.123456Z``) as epoch ms (0: none)."""
    if not text:
        return 0
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return 0


def _answer(view: RequestView, record: dict[str, Any]) -> None:
    from ..core import records

    def field(name: str) -> bytes | None:
        value = record.get(name)
        return value if value is None or isinstance(value, bytes) else str(value).encode()

    reply = records.decode_outcome(view.request_id, [field(n) for n in records.STORED_OUTCOME])
    if reply is None:
        planned = _pretty.decode(field("children") or b"[]")
        view.children = [str(c) for c in planned] if isinstance(planned, list) else []
        return
    view.status, view.op, view.reply = "answered", op_of(reply), pretty(wire.encode(reply))
    if isinstance(reply, ForkResult):
        view.code = "OK"
        view.children = [reply.session.id] if reply.session is not UNSET else [s.id for s in reply.sessions or []]
    elif isinstance(reply, MergeResult | SelectResult):
        view.code, merged = "OK", reply.merged_from
        view.children = [reply.parent, merged.session]
        view.merged = (f"{merged.session} [{merged.from_seq}-{merged.to_seq}] into {reply.parent} "
                       f"at seq {reply.from_seq}")
        view.abandoned = list(reply.abandoned) if isinstance(reply, SelectResult) else []
    else:
        view.code, view.message = reply.code, reply.message


def _from_stream(view: RequestView, redis: Any) -> None:
    for entry_id, fields in redis.xrevrange(keys.OUTCOME_STREAM, count=SCAN_OUTCOMES):
        if wire.text(fields.get(b"requestId", fields.get("requestId", b""))) == view.request_id:
            outcome = outcome_of(wire.text(entry_id), fields)
            view.answered = view.answered or outcome.time
            view.run_ms = outcome.duration_us / 1000
            view.latency_ms = outcome.latency_us / 1000 if outcome.latency_us else view.latency_ms
            if view.latency_ms is not None and not view.enqueued:
                view.enqueued = view.answered - int(view.latency_ms)
            return


def pretty(raw: bytes | str) -> str:
    """JSON indented for reading (as it is, when it is not JSON)."""
    text = wire.text(raw)
    try:
        return msgspec.json.format(text, indent=2)
    except msgspec.DecodeError:
        return text


class TreeLine(msgspec.Struct, kw_only=True):
    """One node of a lineage as a line of the tree: its depth, id, state, seed, and its merge edge
    (the session it was last merged into and at which seq there; "" when none)."""

    depth: int
    id: str
    live: bool
    seed: str
    asked: bool
    state: str = ""
    merged_into: str = ""
    merged_at: int = -1


class SessionView(msgspec.Struct, kw_only=True):
    """A session found by id: its header, state, length and lineage."""

    id: str
    header: str
    state: str
    length: int
    tree: list[TreeLine]


def find_session(registry: Registry, session_id: str, max_nodes: int = 500) -> SessionView | None:
    """The session ``session_id`` (live or disposed), or ``None`` (never created, deleted, or not an id)."""
    if not rules.is_valid_id(session_id):
        return None
    try:
        tree = lineage.lineage(registry, session_id, max_nodes=max_nodes)
        header = registry.header(session_id)
    except errors.ForkError as exc:
        if exc.code is errors.ErrorCode.SESSION_NOT_FOUND:
            return None
        raise
    lines = [TreeLine(depth=i, id=n.id, live=n.live, seed=lineage.seed_text(n), asked=False)
             for i, n in enumerate(tree.ancestors)]

    def walk(node: lineage.Node, depth: int, asked: bool) -> None:
        lines.append(TreeLine(depth=depth, id=node.id, live=node.live, seed=lineage.seed_text(node), asked=asked))
        for child in node.children:
            walk(child, depth + 1, False)

    walk(tree.root, len(tree.ancestors), True)
    for line in lines:  # each node's state and merge edge (one read each)
        try:
            state = registry.state_of(line.id)
        except errors.ForkError:
            continue
        line.state = state.state
        if state.merged_into is not UNSET:
            line.merged_into, line.merged_at = state.merged_into.session, state.merged_into.seq
    asked = next(line for line in lines if line.asked)
    return SessionView(id=session_id, header=pretty(wire.encode(header)), state=asked.state or "live",
                       length=registry.length(session_id), tree=lines)


class QueuedRow(msgspec.Struct, kw_only=True):
    """A request waiting in a shard's queue: its id and when it was enqueued (epoch ms; 0: not known)."""

    request_id: str
    enqueued: int


class ShardView(msgspec.Struct, kw_only=True):
    """One shard: its queue's depth and next requests (the oldest first), whether it is paused, its workers."""

    index: int
    depth: int
    paused: bool
    workers: list[WorkerRow]
    queued: list[QueuedRow] = msgspec.field(default_factory=list)
    answered: dict[str, int] = msgspec.field(default_factory=dict)
    """Per worker name, how many of the shard's newest ``FINISHED_LOOKED_AT`` finished jobs it ran."""
    looked_at: int = 0
    """How many finished jobs ``answered`` counts (RQ keeps each ``result_ttl`` after its end)."""


QUEUED_SHOWN = 20
"""How many of a shard's waiting requests the Workers page lists (the next to run)."""
FINISHED_LOOKED_AT = 2000
"""How many of a shard's newest finished jobs the Workers page counts per worker."""


def shard_views(shards: Sequence[Any], settings: Any) -> list[ShardView]:
    from ..protocol import rq_layout

    views = []
    for i, redis in enumerate(shards):
        queue = rq_layout.queue_key(settings.queue)
        ids = [wire.text(raw) for raw in redis.lrange(queue, 0, QUEUED_SHOWN - 1)]
        pipe = redis.pipeline(transaction=False)
        for request_id in ids:
            pipe.hget(rq_layout.job_key(request_id), "enqueued_at")
        times = pipe.execute() if ids else []
        answered, looked_at = _answered_by(redis, settings.queue)
        views.append(ShardView(index=i, depth=int(redis.llen(queue)), paused=pauses.is_paused(redis),
                               workers=worker_rows(redis, settings),
                               queued=[QueuedRow(request_id=r, enqueued=_rq_time(None if t is None else wire.text(t)))
                                       for r, t in zip(ids, times, strict=True)],
                               answered=answered, looked_at=looked_at))
    return views


def _answered_by(redis: Any, queue: str) -> tuple[dict[str, int], int]:
    """Per worker, the shard's newest finished jobs it ran, and how many were looked at."""
    from ..protocol import rq_layout

    finished = redis.zrange(rq_layout.finished_key(queue), -FINISHED_LOOKED_AT, -1)
    pipe = redis.pipeline(transaction=False)
    for job_id in finished:
        pipe.hget(rq_layout.job_key(wire.text(job_id)), "worker_name")
    counts: dict[str, int] = defaultdict(int)
    for name in pipe.execute() if finished else []:
        if name:
            counts[wire.text(name)] += 1
    return dict(counts), len(finished)


def audit_entries(shards: Sequence[Any], count: int = 50) -> list[pauses.AuditEntry]:
    entries = [e for i, redis in enumerate(shards) for e in pauses.audit(redis, count, shard=i)]
    entries.sort(key=lambda e: (e.time, e.id), reverse=True)
    return entries[:count]
