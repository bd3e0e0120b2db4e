"""OpenTelemetry metrics beside the spans: a worker's ``Observer`` records the counters
and histograms it serves to Prometheus on an OpenTelemetry meter too, with the same names, the same
attributes (``code``, ``shard``), the same buckets and the same counts, read here through the SDK's
``InMemoryMetricReader``; without the ``opentelemetry`` package it records nothing and fails nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry
from redis import Redis

from sessionfork import NewEvent, Registry
from sessionfork.core.wire import Reply
from sessionfork.ops import metrics
from sessionfork.ops.metrics import HISTOGRAMS, Observer
from sessionfork.protocol.requests import Limits
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.service import RequestService

NAMES = {metrics.FORKS, metrics.MERGES, metrics.DURATION, metrics.LATENCY, metrics.SEED_LENGTH, metrics.CHILDREN,
         metrics.QUEUE_DEPTH}


def replies(redis: Redis, registry: Registry) -> list[Reply]:
    """Real outcomes: a fork, a fan-out of two, a missing source, a request that is not JSON, a merge."""
    src = registry.create("otel-src")
    registry.append(src, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    service = RequestService(registry, Outcomes(redis, ttl=60, stream_maxlen=1000), reply_channel="sf:replies",
                          limits=Limits(max_fanout=16))
    return [service.handle('{"source":"otel-src","sessionId":"o1"}', "r1"),
            service.handle('{"source":"otel-src","sessionIds":["o2","o3"]}', "r2"),
            service.handle('{"source":"nobody"}', "r3"),
            service.handle("not json", "r4"),
            service.handle('{"op":"merge","parent":"otel-src","child":"nobody","mode":"events"}', "r5")]


class Meter:
    """An SDK ``MeterProvider`` read by an ``InMemoryMetricReader``."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def read(self) -> dict[str, Any]:
        """Each metric by name: its SDK data (``data_points``, each with ``attributes``)."""
        data = self.reader.get_metrics_data()
        assert data is not None
        return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@pytest.fixture
def meter() -> Iterator[Meter]:
    meter = Meter()
    yield meter
    meter.provider.shutdown()


def observed(redis: Redis, registry: Registry, meter: Meter, shard: int | None = None) -> Observer:
    """An observer of ``replies``, each with a run time (the fourth without a known latency)."""
    observer = Observer(queue_depth=lambda: 7, shard=shard, meter_provider=meter.provider)
    for i, reply in enumerate(replies(redis, registry)):
        observer(f"r{i}", '{"source":"otel-src"}', reply, 0.002 * (i + 1), None if i == 3 else 0.5)
    return observer


def prometheus_samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value for family in registry.collect() for s in family.samples}


def test_the_otel_metrics_are_the_prometheus_ones_by_name(redis: Redis, registry: Registry, meter: Meter) -> None:
    observer = observed(redis, registry, meter)
    assert set(meter.read()) == NAMES
    families = {family.name for family in observer.registry.collect()}
    assert families >= NAMES  # prometheus_client names a counter's family without its _total


def test_the_counts_sums_and_buckets_match_prometheus(redis: Redis, registry: Registry, meter: Meter) -> None:
    observer = observed(redis, registry, meter)
    prom = prometheus_samples(observer.registry)
    read = meter.read()
    forks = {(dict(p.attributes)["op"], dict(p.attributes)["code"]): p.value
             for p in read[metrics.FORKS].data.data_points}
    assert forks == {("fork", "OK"): 2, ("fork", "SESSION_NOT_FOUND"): 1, ("fork", "INVALID_REQUEST"): 1}
    assert forks == {(dict(labels)["op"], dict(labels)["code"]): value for (name, labels), value in prom.items()
                     if name == "sessionfork_forks_total"}
    merges = {(dict(p.attributes)["op"], dict(p.attributes)["code"]): p.value
              for p in read[metrics.MERGES].data.data_points}
    assert merges == {("merge", "SESSION_NOT_FOUND"): 1}
    assert merges == {(dict(labels)["op"], dict(labels)["code"]): value for (name, labels), value in prom.items()
                      if name == "sessionfork_merges_total"}
    for name, (_, _, buckets) in HISTOGRAMS.items():
        points = {dict(p.attributes)["op"]: p for p in read[name].data.data_points}
        assert set(points) <= {"fork", "merge"}, name
        for op, point in points.items():
            by_op = frozenset({("op", op)})
            assert tuple(point.explicit_bounds) == tuple(float(b) for b in buckets), name
            assert point.count == prom[(f"{name}_count", by_op)], name
            assert point.sum == pytest.approx(prom[(f"{name}_sum", by_op)]), name
            cumulative = [sum(point.bucket_counts[:i + 1]) for i in range(len(buckets))]
            les = {float(dict(labels)["le"]): value for (sample, labels), value in prom.items()
                   if sample == f"{name}_bucket" and dict(labels)["op"] == op}
            assert cumulative == [les[float(b)] for b in buckets], name
    assert prom[(f"{metrics.LATENCY}_count", frozenset({("op", "fork")}))] == 3  # the refused one has no enqueue time
    assert prom[(f"{metrics.LATENCY}_count", frozenset({("op", "merge")}))] == 1
    assert prom[(f"{metrics.SEED_LENGTH}_count", frozenset({("op", "fork")}))] == 3  # one child, then two
    (depth,) = read[metrics.QUEUE_DEPTH].data.data_points
    assert depth.value == 7


def test_a_shard_workers_otel_metrics_carry_its_shard(redis: Redis, registry: Registry, meter: Meter) -> None:
    observed(redis, registry, meter, shard=2)
    for name, metric in meter.read().items():
        assert all(dict(p.attributes).get("shard") == "2" for p in metric.data.data_points), name


def test_without_opentelemetry_nothing_is_recorded_and_nothing_fails(
        redis: Redis, registry: Registry, meter: Meter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_otel_metrics", lambda: None)  # as if the package were not installed
    observer = observed(redis, registry, meter)
    assert observer.otel is None
    assert meter.reader.get_metrics_data() is None or not meter.read()
    assert prometheus_samples(observer.registry)[("sessionfork_forks_total",
                                                  frozenset({("code", "OK"), ("op", "fork")}))] == 2
