"""What a worker tells operators: Prometheus metrics and one log line per outcome.

``Observer`` is the worker's ``on_outcome`` hook; its log line carries ``OUTCOME_FIELDS``, written
by structlog's formatter (``configure_logging``) as logfmt or JSON. Metrics live in their own
``CollectorRegistry`` (no process-global state) and are served by ``serve(port)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import IO, Any

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ..core import rules
from ..core.wire import ForkResult, MergeFailure, MergeResult, Outcome, SelectFailure, SelectResult
from ..protocol.outcomes import code_of

log = logging.getLogger("sessionfork.outcome")
_request_source = msgspec.json.Decoder(dict[str, Any])


class Observer:
    """Counts, times and logs every outcome a worker produces."""

    def __init__(self, queue_depth: Callable[[], int] | None = None, *, shard: int | None = None,
                 paused: Callable[[], bool] | None = None) -> None:
        """``shard``: the shard the worker serves, on a sharded queue: every metric then carries a
        ``shard`` label (its index), so a dashboard sums or splits the shards. ``paused``: whether
        the worker's queue server is paused (``ops.pauses``), read at each scrape."""
        self.registry = CollectorRegistry()
        self.shard = shard
        labels = {} if shard is None else {"shard": str(shard)}
        self.forks = Counter("sessionfork_forks", "Fork requests by outcome code", ["code", *labels],
                             registry=self.registry)
        self.merges = Counter("sessionfork_merges", "Merge and select requests by op and outcome code",
                              ["op", "code", *labels], registry=self.registry)
        self.duration = Histogram("sessionfork_fork_duration_seconds", "Time to run one request to its outcome",
                                  list(labels), registry=self.registry,
                                  buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5))
        self.seed_length = Histogram("sessionfork_seed_length", "Events inherited by each child",
                                     list(labels), registry=self.registry,
                                     buckets=(0, 10, 100, 1_000, 10_000, 100_000, 1_000_000))
        self.children = Histogram("sessionfork_children_per_request", "Children created per request",
                                  list(labels), registry=self.registry, buckets=(0, 1, 2, 4, 8, 16, 64, 256, 1024))
        self.depth = Gauge("sessionfork_queue_depth", "Requests waiting in the queue", list(labels),
                           registry=self.registry)
        self.paused = Gauge("sessionfork_queue_paused", "1 while the queue is paused (workers take no job)",
                            list(labels), registry=self.registry)
        if labels:  # the children bound once: the hot path below stays as without shards
            self.forks = _Bound(self.forks, labels)  # type: ignore[assignment]
            self.merges = _Bound(self.merges, labels)  # type: ignore[assignment]
            self.duration = self.duration.labels(**labels)
            self.seed_length = self.seed_length.labels(**labels)
            self.children = self.children.labels(**labels)
            self.depth = self.depth.labels(**labels)
            self.paused = self.paused.labels(**labels)
        if queue_depth is not None:
            self.depth.set_function(queue_depth)
        if paused is not None:
            self.paused.set_function(lambda: float(paused()))

    def __call__(self, request_id: str, payload: str, reply: Outcome, seconds: float) -> None:
        code = code_of(reply)
        op = _OPS.get(type(reply), "fork")
        if op == "fork":
            self.forks.labels(code=code).inc()
        else:
            self.merges.labels(op=op, code=code).inc()
        self.duration.observe(seconds)
        made = _children(reply)
        self.children.observe(len(made))
        for child in made:
            self.seed_length.observe(0 if child.seed_length is msgspec.UNSET else child.seed_length)
        log.info("%s %s", op, code, extra={
            "requestId": request_id, "op": op, "source": _source(payload), "children": [c.id for c in made],
            "code": code, "durationMs": round(seconds * 1000, 3)})

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)


class _Bound:
    """``Counter.labels(code=...)`` with the shard label filled in."""

    def __init__(self, counter: Counter, fixed: dict[str, str]) -> None:
        self._counter, self._fixed = counter, fixed

    def labels(self, **labels: str) -> Any:
        return self._counter.labels(**labels, **self._fixed)


_OPS: dict[type, str] = {MergeResult: "merge", MergeFailure: "merge", SelectResult: "select", SelectFailure: "select"}


def _children(reply: Outcome) -> list[Any]:
    if isinstance(reply, ForkResult):
        if reply.session is not msgspec.UNSET:
            return [reply.session]
        if reply.sessions is not msgspec.UNSET:
            return list(reply.sessions)
    return []


def _source(payload: str) -> Any:
    try:
        source = _request_source.decode(payload).get("source")
    except Exception:  # a log field: any payload, however hostile, just has no source to show
        return None
    source = source.get("id") if isinstance(source, dict) else source
    return None if source is None else rules.shown_id(source)  # bounded and escaped


OUTCOME_FIELDS = ("requestId", "op", "source", "children", "code", "durationMs")
"""What every outcome log line carries beyond time, level, logger and event (``Observer``)."""


def _text_values(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    # logfmt shows a list as Python's repr: children as c1,c2 instead.
    return {k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in event.items()}


def _time_first(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    return {"time": event.pop("time", None), **event}


def formatter(fmt: str) -> logging.Formatter:
    """structlog's formatter of ``text`` (logfmt: ``time=… level=info logger=… event="fork OK"
    requestId=…``) or ``json`` (one object per line) log lines: every record (RQ's too) with its
    time (RFC 3339, UTC), level, logger, event and the fields passed as ``extra``."""
    chain: list[Any] = [structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                        structlog.stdlib.ExtraAdder(),
                        structlog.processors.TimeStamper(fmt="iso", utc=True, key="time")]
    render: list[Any] = ([_time_first, structlog.processors.JSONRenderer(sort_keys=False)] if fmt == "json" else
                         [_text_values, structlog.processors.LogfmtRenderer(
                             key_order=["time", "level", "logger", "event"], bool_as_flag=False)])
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=chain,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, *render])


def configure_logging(fmt: str, level: str, stream: IO[str] | None = None) -> None:
    """``text`` or ``json`` log lines (``formatter``) on ``stream`` (stderr), from ``level`` up
    (called by entry points only)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
