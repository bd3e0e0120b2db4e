"""What a worker tells operators: Prometheus metrics, the same through OpenTelemetry, and one log
line per outcome.

``Observer`` is the worker's ``on_outcome`` hook; its log line carries ``OUTCOME_FIELDS``, written
by structlog's formatter (``configure_logging``) as logfmt or JSON. Metrics live in their own
``CollectorRegistry`` (no process-global state) and are served by ``serve(port, addr)``: the
counters, histograms and gauges named below (``FORKS`` ... ``BUILD_INFO``) and the process's own
(``process_*`` on Linux, ``python_info``). With the ``opentelemetry`` package installed the same
counters, histograms and queue-depth gauge (same names, attributes and buckets) are recorded on an
OpenTelemetry meter too: the process's global meter provider unless one is given; sessionfork
configures no exporter.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import IO, Any, Final, NamedTuple

import msgspec
import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

from .. import __version__
from ..core import rules
from ..core.wire import ForkResult, Outcome
from ..protocol import operations
from ..protocol.operations import FORKS, MERGES
from ..protocol.outcomes import code_of

log = logging.getLogger("sessionfork.outcome")
_request_source = msgspec.json.Decoder(dict[str, Any])

DURATION: Final = "sessionfork_fork_duration_seconds"
"""Histogram by ``op``: a request's run time, from its dequeue to its outcome (what a worker is busy for)."""
LATENCY: Final = "sessionfork_fork_latency_seconds"
"""Histogram by ``op``: a request's enqueue-to-outcome latency (queue wait and run time)."""
SEED_LENGTH: Final = "sessionfork_seed_length"
"""Histogram by ``op``: events each child inherits (a fork's children: merges and selects make none)."""
CHILDREN: Final = "sessionfork_children_per_request"
"""Histogram by ``op``: children created per request (0 for merges and selects)."""
QUEUE_DEPTH: Final = "sessionfork_queue_depth"
"""Gauge: requests waiting in the served queue, read when scraped."""
QUEUE_PAUSED: Final = "sessionfork_queue_paused"
"""Gauge: 1 while the served queue is paused (``ops.pauses``: its workers take no job), read when scraped."""
BUILD_INFO: Final = "sessionfork_build_info"
"""Gauge, always 1: ``version`` (sessionfork's), ``rq_version`` and ``redis_py_version``."""

HISTOGRAMS: Final[dict[str, tuple[str, str, tuple[float, ...]]]] = {
    DURATION: ("Time to run one request to its outcome", "s",
               (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5)),
    LATENCY: ("Time from a request's enqueue to its outcome", "s",
              (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)),
    SEED_LENGTH: ("Events inherited by each child", "", (0, 10, 100, 1_000, 10_000, 100_000, 1_000_000)),
    CHILDREN: ("Children created per request", "", (0, 1, 2, 4, 8, 16, 64, 256, 1024)),
}
"""Every histogram: its help, its unit (OpenTelemetry's) and its buckets, the same on both sides."""


def build_labels() -> dict[str, str]:
    """``sessionfork_build_info``'s labels: sessionfork's version and the RQ and redis-py it runs on."""
    return {"version": __version__, "rq_version": _version_of("rq"), "redis_py_version": _version_of("redis")}


def _version_of(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


class Observer:
    """Counts, times and logs every outcome a worker produces."""

    def __init__(self, queue_depth: Callable[[], int] | None = None, *, shard: int | None = None,
                 meter_provider: Any = None, paused: Callable[[], bool] | None = None,
                 prometheus: bool = True) -> None:
        """``shard``: the shard the worker serves, on a sharded queue: every metric then carries a
        ``shard`` label (its index), so a dashboard sums or splits the shards. ``meter_provider``:
        the OpenTelemetry ``MeterProvider`` to record on (default: the global one; ignored without
        the ``opentelemetry`` package). ``paused``: whether the worker's queue server is paused
        (``ops.pauses``), read at each scrape. ``prometheus``: whether outcomes update the
        Prometheus metrics (``registry``); the worker command passes whether it serves them
        (``--metrics-port``): unserved, nobody reads them, and an outcome skips their updates."""
        self.prometheus = prometheus
        self.registry = CollectorRegistry()
        self.shard = shard
        labels = {} if shard is None else {"shard": str(shard)}
        self.forks = Counter(FORKS, "Fork requests by op and outcome code", ["op", "code", *labels],
                             registry=self.registry)
        self.merges = Counter(MERGES, "Merge and select requests by op and outcome code", ["op", "code", *labels],
                              registry=self.registry)
        self.duration, self.latency, self.seed_length, self.children = (
            Histogram(name, help_, ["op", *labels], registry=self.registry, buckets=buckets)
            for name, (help_, _, buckets) in HISTOGRAMS.items())
        # Each op's series bound once (the shard's too): the hot path below looks one up by op.
        counters = {FORKS: self.forks, MERGES: self.merges}
        self._by_op = {op: _OpSeries(_Bound(counters[entry.metric], {"op": op, **labels}),
                                     *(h.labels(op=op, **labels) for h in (self.duration, self.latency,
                                                                           self.seed_length, self.children)))
                       for op, entry in operations.OPERATIONS.items()}
        self.depth = Gauge(QUEUE_DEPTH, "Requests waiting in the queue", list(labels), registry=self.registry)
        self.paused = Gauge(QUEUE_PAUSED, "1 while the queue is paused (workers take no job)", list(labels),
                            registry=self.registry)
        Gauge(BUILD_INFO, "sessionfork's version and the RQ and redis-py it runs on (always 1)",
              [*build_labels(), *labels], registry=self.registry).labels(**build_labels(), **labels).set(1)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=self.registry)  # python_info
        if labels:  # the gauges' children bound once
            self.depth = self.depth.labels(**labels)
            self.paused = self.paused.labels(**labels)
        if queue_depth is not None:
            self.depth.set_function(queue_depth)
        if paused is not None:
            self.paused.set_function(lambda: float(paused()))
        self.otel = _OtelMetrics.of(meter_provider, labels, queue_depth)

    def __call__(self, request_id: str, payload: str, reply: Outcome, seconds: float,
                 latency: float | None = None) -> None:
        """One outcome: ``seconds`` its run time, ``latency`` its enqueue-to-outcome time (``None``:
        unknown, as for a queue entry refused unread)."""
        code = code_of(reply)
        op = operations.of_reply(reply)
        made = _children(reply)
        seeds = [0 if child.seed_length is msgspec.UNSET else child.seed_length for child in made]
        if self.prometheus:
            series = self._by_op[op.name]
            series.outcomes.labels(code=code).inc()
            series.duration.observe(seconds)
            if latency is not None:
                series.latency.observe(latency)
            series.children.observe(len(made))
            for seed in seeds:
                series.seed_length.observe(seed)
        if self.otel is not None:
            self.otel.record(op, code, seconds, latency, len(made), seeds)
        if log.isEnabledFor(logging.INFO):  # the line's fields (the payload read again) only when logged
            log.info("%s %s", op.name, code, extra={
                "requestId": request_id, "op": op.name, "source": _source(payload), "children": [c.id for c in made],
                "code": code, "durationMs": round(seconds * 1000, 3)})

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve the metrics over HTTP on ``addr:port`` (``/metrics``), in a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)


class _OpSeries(NamedTuple):
    """One op's outcome counter (``code`` still to give) and its histograms' series."""

    outcomes: _Bound
    duration: Any
    latency: Any
    seed_length: Any
    children: Any


class _Bound:
    """``Counter.labels(code=...)`` with the op's and the shard's labels filled in."""

    def __init__(self, counter: Counter, fixed: dict[str, str]) -> None:
        self._counter, self._fixed = counter, fixed

    def labels(self, **labels: str) -> Any:
        return self._counter.labels(**labels, **self._fixed)


@functools.cache
def _otel_metrics() -> Any:
    """The ``opentelemetry.metrics`` module, or ``None`` without the package (looked up once)."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    return metrics


class _OtelMetrics:
    """The Prometheus counters and histograms again, as OpenTelemetry instruments of one meter."""

    def __init__(self, meter: Any, labels: dict[str, str], queue_depth: Callable[[], int] | None) -> None:
        self.labels = labels
        self.forks = meter.create_counter(FORKS, unit="", description="Fork requests by op and outcome code")
        self.merges = meter.create_counter(MERGES, unit="",
                                           description="Merge and select requests by op and outcome code")
        self.counters = {FORKS: self.forks, MERGES: self.merges}  # by an operation's ``metric``
        self.duration, self.latency, self.seed_length, self.children = (
            meter.create_histogram(name, unit=unit, description=help_, explicit_bucket_boundaries_advisory=buckets)
            for name, (help_, unit, buckets) in HISTOGRAMS.items())
        if queue_depth is not None:
            def depth(_: Any) -> Iterator[Any]:
                yield _otel_metrics().Observation(queue_depth(), labels)
            meter.create_observable_gauge(QUEUE_DEPTH, callbacks=[depth], description="Requests waiting in the queue")

    @classmethod
    def of(cls, provider: Any, labels: dict[str, str], queue_depth: Callable[[], int] | None) -> _OtelMetrics | None:
        metrics = _otel_metrics()
        if metrics is None:
            return None
        provider = metrics.get_meter_provider() if provider is None else provider
        return cls(provider.get_meter("sessionfork", __version__), labels, queue_depth)

    def record(self, op: operations.Operation, code: str, seconds: float, latency: float | None, children: int,
               seeds: list[int]) -> None:
        attributes = {"op": op.name, **self.labels}
        self.counters[op.metric].add(1, {**op.labels(code), **self.labels})
        self.duration.record(seconds, attributes)
        if latency is not None:
            self.latency.record(latency, attributes)
        self.children.record(children, attributes)
        for seed in seeds:
            self.seed_length.record(seed, attributes)


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
