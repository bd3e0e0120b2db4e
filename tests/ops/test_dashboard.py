"""Operators' views: the outcome stream (events), stats, Prometheus metrics and JSON log lines."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client import generate_latest
from redis import Redis

from sessionfork import NewEvent, Registry
from sessionfork.core.factories import now_ms
from sessionfork.core.wire import Reply
from sessionfork.embedded import EmbeddedServer, free_port
from sessionfork.ops.metrics import Observer, formatter
from sessionfork.ops.stats import compute_stats, format_line, read_outcomes
from sessionfork.protocol.requests import Limits
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.service import RequestService


def service(redis: Redis, registry: Registry) -> RequestService:
    return RequestService(registry, Outcomes(redis, ttl=60, stream_maxlen=1000), reply_channel="sf:replies",
                       limits=Limits(max_fanout=16))


def outcomes(redis: Redis, registry: Registry) -> list[Reply]:
    src = registry.create("src")
    registry.append(src, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    svc = service(redis, registry)
    return [svc.handle('{"source":"src","sessionId":"c1"}', "r1"),
            svc.handle('{"source":"src","sessionId":"c1"}', "r2"),
            svc.handle('{"source":"nobody"}', "r3"),
            svc.handle("not json", "r4")]


def test_every_outcome_is_in_the_stream_in_order(redis: Redis, registry: Registry) -> None:
    outcomes(redis, registry)
    seen = list(read_outcomes(redis))
    assert [(o.request_id, o.code) for o in seen] == [
        ("r1", "OK"), ("r2", "SESSION_ALREADY_EXISTS"), ("r3", "SESSION_NOT_FOUND"), ("r4", "INVALID_REQUEST")]


def test_lines_name_request_code_and_child(redis: Redis, registry: Registry) -> None:
    outcomes(redis, registry)
    first = format_line(next(read_outcomes(redis)))
    assert "r1" in first and "OK" in first and "c1 <- src (seed 2)" in first


def test_stats_count_codes_and_percentiles(redis: Redis, registry: Registry) -> None:
    outcomes(redis, registry)
    stats = compute_stats(redis, 3600, now_ms())
    assert stats.total == 4
    assert stats.codes == {"INVALID_REQUEST": 1, "OK": 1, "SESSION_ALREADY_EXISTS": 1, "SESSION_NOT_FOUND": 1}
    run = stats.run_time
    assert run.p50_ms is not None and run.p99_ms is not None and run.p50_ms <= run.p99_ms
    assert stats.latency.p50_ms is None  # handled directly, not enqueued: no enqueue time to measure from


def test_stats_window_excludes_older_outcomes(redis: Redis, registry: Registry) -> None:
    outcomes(redis, registry)
    assert compute_stats(redis, 60, now_ms() + 3_600_000).total == 0


def test_events_command_json_lines(server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    outcomes(redis, registry)
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "outcomes", "--json"],
                         capture_output=True, text=True, timeout=60, check=True)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["code"] for line in lines] == ["OK", "SESSION_ALREADY_EXISTS", "SESSION_NOT_FOUND", "INVALID_REQUEST"]
    assert lines[0]["reply"]["session"]["id"] == "c1"


def test_stats_command_prints_counts(server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    outcomes(redis, registry)
    out = subprocess.run([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "stats"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert "outcomes in the last 3600s: 4" in out.stdout
    assert re.search(r"^  SESSION_NOT_FOUND +1$", out.stdout, re.MULTILINE)


def test_metrics_count_outcomes_by_code(redis: Redis, registry: Registry) -> None:
    observer = Observer(queue_depth=lambda: 7)
    for i, reply in enumerate(outcomes(redis, registry)):
        observer(f"r{i}", '{"source":"src"}', reply, 0.002)
    port = free_port()
    observer.serve(port, addr="127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'sessionfork_forks_total{code="OK",op="fork"} 1.0' in text
    assert 'sessionfork_forks_total{code="SESSION_NOT_FOUND",op="fork"} 1.0' in text
    assert "sessionfork_queue_depth 7.0" in text
    assert 'sessionfork_fork_duration_seconds_count{op="fork"} 4.0' in text
    assert 'sessionfork_children_per_request_sum{op="fork"} 1.0' in text


def test_every_per_request_metric_carries_the_requests_op(redis: Redis, registry: Registry) -> None:
    """A merge's and a select's run time, latency and children are theirs, not counted as a fork's."""
    registry.append(registry.create("p"), [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    svc = service(redis, registry)
    observer = Observer()
    requests = [('{"source":"p","sessionId":"k"}', 0.001),
                ('{"op":"merge","parent":"p","child":"k","mode":"events"}', 0.01),
                ('{"op":"select","parent":"p","candidates":["nobody"],"winner":"nobody","mode":"events"}', 0.1)]
    for i, (payload, seconds) in enumerate(requests):
        observer(f"o{i}", payload, svc.handle(payload, f"o{i}"), seconds, seconds * 2)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in observer.registry.collect() for s in family.samples}
    for op, seconds in zip(("fork", "merge", "select"), (0.001, 0.01, 0.1), strict=True):
        for name, value in (("sessionfork_fork_duration_seconds_sum", seconds),
                            ("sessionfork_fork_latency_seconds_sum", seconds * 2),
                            ("sessionfork_children_per_request_count", 1)):
            assert samples[(name, (("op", op),))] == pytest.approx(value), (name, op)
    assert samples[("sessionfork_forks_total", (("code", "OK"), ("op", "fork")))] == 1
    merges = [(dict(labels)["op"], value) for (name, labels), value in samples.items()
              if name == "sessionfork_merges_total"]
    assert sorted(merges) == [("merge", 1), ("select", 1)]  # whatever their codes
    assert samples[("sessionfork_seed_length_count", (("op", "merge"),))] == 0


def test_an_unserved_observer_updates_no_prometheus_metric_and_still_logs_each_outcome(
        redis: Redis, registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    """The worker command without ``--metrics-port``: nobody reads its Prometheus metrics, so an
    outcome skips their updates; its log line stays."""
    served, unserved = Observer(), Observer(prometheus=False)
    with caplog.at_level(logging.INFO, logger="sessionfork.outcome"):
        for i, reply in enumerate(outcomes(redis, registry)):
            served(f"r{i}", '{"source":"src"}', reply, 0.002)
            unserved(f"r{i}", '{"source":"src"}', reply, 0.002)
    assert 'sessionfork_fork_duration_seconds_count{op="fork"} 4.0' in generate_latest(served.registry).decode()
    text = generate_latest(unserved.registry).decode()
    assert 'sessionfork_fork_duration_seconds_count{op="fork"} 0.0' in text and "sessionfork_forks_total{" not in text
    assert [r.getMessage() for r in caplog.records].count("fork OK") == 2


def test_a_shard_workers_metrics_carry_its_shard_label(redis: Redis, registry: Registry) -> None:
    observer = Observer(queue_depth=lambda: 3, shard=2)
    for i, reply in enumerate(outcomes(redis, registry)):
        observer(f"r{i}", '{"source":"src"}', reply, 0.002)
    text = generate_latest(observer.registry).decode()
    assert 'sessionfork_forks_total{code="OK",op="fork",shard="2"} 1.0' in text
    assert 'sessionfork_queue_depth{shard="2"} 3.0' in text
    assert 'sessionfork_fork_duration_seconds_count{op="fork",shard="2"} 4.0' in text
    assert 'sessionfork_children_per_request_sum{op="fork",shard="2"} 1.0' in text
    assert 'sessionfork_seed_length_count{op="fork",shard="2"} 1.0' in text


def test_outcome_log_line_is_json_with_fields(redis: Redis, registry: Registry,
                                              caplog: pytest.LogCaptureFixture) -> None:
    reply = outcomes(redis, registry)[0]
    with caplog.at_level(logging.INFO, logger="sessionfork.outcome"):
        Observer()("r1", '{"source":{"id":"src","instance":"t"}}', reply, 0.0015)
    line = json.loads(formatter("json").format(caplog.records[-1]))
    assert {k: line[k] for k in ("requestId", "op", "source", "children", "code", "durationMs")} == {
        "requestId": "r1", "op": "fork", "source": "src", "children": ["c1"], "code": "OK", "durationMs": 1.5}


def test_outcomes_of_enqueued_requests_carry_their_latency(redis: Redis, registry: Registry) -> None:
    src = registry.create("lat-src")
    registry.append(src, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    service(redis, registry).handle('{"source":"lat-src"}', "lat-1", enqueued_ms=now_ms() - 250)
    (outcome,) = list(read_outcomes(redis))
    assert 250_000 <= outcome.latency_us < 60_000_000
    stats = compute_stats(redis, 3600, now_ms())
    assert stats.latency.p50_ms is not None and stats.latency.p50_ms >= 250
