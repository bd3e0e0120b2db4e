"""What a worker tells operators: Prometheus metrics and one log line per outcome.

``Observer`` is the worker's ``on_outcome`` hook. Metrics live in their own
``CollectorRegistry`` (no process-global state) and are served by ``serve(port)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ..core import rules
from ..core.wire import ForkFailure, ForkResult, Reply

log = logging.getLogger("sessionfork.outcome")
_request_source = msgspec.json.Decoder(dict[str, Any])


class Observer:
    """Counts, times and logs every outcome a worker produces."""

    def __init__(self, queue_depth: Callable[[], int] | None = None, *, shard: int | None = None) -> None:
        """``shard``: the shard the worker serves, on a sharded queue: every metric then carries a
        ``shard`` label (its index), so a dashboard sums or splits the shards."""
        self.registry = CollectorRegistry()
        self.shard = shard
        labels = {} if shard is None else {"shard": str(shard)}
        self.forks = Counter("sessionfork_forks", "Fork requests by outcome code", ["code", *labels],
                             registry=self.registry)
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
        if labels:  # the children bound once: the hot path below stays as without shards
            self.forks = _Bound(self.forks, labels)  # type: ignore[assignment]
            self.duration = self.duration.labels(**labels)
            self.seed_length = self.seed_length.labels(**labels)
            self.children = self.children.labels(**labels)
            self.depth = self.depth.labels(**labels)
        if queue_depth is not None:
            self.depth.set_function(queue_depth)

    def __call__(self, request_id: str, payload: str, reply: Reply, seconds: float) -> None:
        code = reply.code if isinstance(reply, ForkFailure) else "OK"
        self.forks.labels(code=code).inc()
        self.duration.observe(seconds)
        made = _children(reply)
        self.children.observe(len(made))
        for child in made:
            self.seed_length.observe(0 if child.seed_length is msgspec.UNSET else child.seed_length)
        log.info("fork %s", code, extra={
            "request_id": request_id, "source": _source(payload), "child": [c.id for c in made] or None,
            "code": code, "duration_ms": round(seconds * 1000, 3)})

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)


class _Bound:
    """``Counter.labels(code=...)`` with the shard label filled in."""

    def __init__(self, counter: Counter, fixed: dict[str, str]) -> None:
        self._counter, self._fixed = counter, fixed

    def labels(self, **labels: str) -> Any:
        return self._counter.labels(**labels, **self._fixed)


def _children(reply: Reply) -> list[Any]:
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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the outcome fields when present."""

    FIELDS = ("request_id", "source", "child", "code", "duration_ms")

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": self.formatTime(record), "level": record.levelname,
                                "logger": record.name, "message": record.getMessage()}
        for field in self.FIELDS:
            if hasattr(record, field):
                line[field] = getattr(record, field)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return msgspec.json.encode(line).decode()


def configure_logging(fmt: str, level: str) -> None:
    """``text`` or ``json`` log lines on stderr (called by entry points only)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
