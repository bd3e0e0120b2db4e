"""The shipped rules and dashboard against a live Prometheus: Debian's ``prometheus``
scrapes a real worker process's metrics port every second and evaluates the shipped rules (their
``for`` set to 0 s, expressions as shipped) while real forks run, errors among them. Every recording
rule and every dashboard expression must then be valid and give data (merges too); the error outcomes
(expected refusals) must show in their rule and fire no alert, and the no-live-worker alert must fire
once the worker stops.

The tests share one worker and one Prometheus and run in file order: the last stops the worker.
"""

from __future__ import annotations

import math
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from helpers import clean_environ, cli_args, make_client, stop, turn, wait_registered, worker_name
from prometheus import JOB, PrometheusServer, dashboard_expressions, recording_rules, shipped_rules, tool, with_for
from waits import wait_until

import sessionfork
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer, free_port
from sessionfork.ops import pauses

ROUNDS = 2  # forks in two scrapes' worth of rounds: every rate sees its counters grow
OK_PER_ROUND, ERRORS_PER_ROUND = 3, 2
ADDRESS = "127.0.0.2"  # the worker's --metrics-address: a loopback address, not the default's 0.0.0.0


@dataclass
class Live:
    prometheus: PrometheusServer
    worker: subprocess.Popen[bytes]
    port: int

    @property
    def metrics_url(self) -> str:
        return f"http://{ADDRESS}:{self.port}/metrics"


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with EmbeddedServer() as server:
        port = free_port()
        name = worker_name("prom")
        # The flag's address (another loopback one than the default's reach) over the variable's.
        worker = subprocess.Popen(cli_args(server.url, "worker", "--name", name, "--log-level", "WARNING",
                                           "--metrics-port", str(port), "--metrics-address", ADDRESS),
                                  env=clean_environ(SESSIONFORK_METRICS_ADDRESS="127.0.0.3"), stdin=subprocess.DEVNULL)
        try:
            with server.client() as redis:
                wait_registered(redis, name)
                with PrometheusServer([f"{ADDRESS}:{port}"], with_for(shipped_rules(), "0s")) as prometheus:
                    wait_until(lambda: prometheus.values(f'up{{job="{JOB}"}} == 1'), 30, "the worker's first scrape")
                    forks(redis, prometheus)
                    # Then the shard paused: SessionforkQueuePausedTooLong fires (its `for` is 0 s
                    # here), so the dashboard's alert annotation has an alert to show.
                    pauses.pause(redis, "test", "the paused-too-long alert")
                    yield Live(prometheus, worker, port)
        finally:
            stop(worker)


def forks(redis: object, prometheus: PrometheusServer) -> None:
    """Real forks and merges through the worker, OK and SESSION_NOT_FOUND, in rounds: each round's
    counts are scraped before the next starts, so every counter and histogram grows between two samples."""
    registry = Registry(redis)  # type: ignore[arg-type]
    registry.append(registry.create("prom-src"), turn(1))
    client = make_client(redis)  # type: ignore[arg-type]
    done = 0
    try:
        for round_ in range(ROUNDS):
            for i in range(OK_PER_ROUND):
                assert client.fork("prom-src", session_id=f"prom-{round_}-{i}", timeout=20).ok
            for _ in range(ERRORS_PER_ROUND):
                assert not client.fork("prom-nobody", timeout=20).ok
            registry.append(f"prom-{round_}-0", turn(2))
            assert client.merge("prom-src", f"prom-{round_}-0", mode="events", timeout=20).ok
            assert not client.merge("prom-src", "prom-nobody", mode="events", timeout=20).ok
            done += OK_PER_ROUND + ERRORS_PER_ROUND + 2
            wait_until(lambda n=done: prometheus.values(  # type: ignore[misc]
                f'sum({{__name__=~"sessionfork_(forks|merges)_total"}}) == {n}'), 30, f"{done} outcomes scraped")
    finally:
        client.close()


def test_refusals_show_on_the_dashboard_and_page_no_one(live: Live) -> None:
    """SESSION_NOT_FOUND outcomes are expected refusals: the refusals' rule shows them, and no alert
    fires but the pause's (every alert's ``for`` is 0 s here: one that read them would fire at once)."""
    wait_until(lambda: live.prometheus.values("sessionfork:refusals:ratio_rate5m > 0"), 30, "refusals recorded")
    # 3 of 7 outcomes are refusals; rate()'s extrapolation differs per series (each starts at its first
    # scrape), so the recorded ratio is near 0.43, not exactly it.
    (ratio,) = live.prometheus.values("sessionfork:refusals:ratio_rate5m")
    assert 0.2 < ratio < 0.7, ratio
    assert live.prometheus.values("sessionfork:fork_errors:ratio_rate5m") == [ratio]  # no INTERNAL among them
    assert live.prometheus.values("sessionfork:internal_errors:rate5m") == [0]
    wait_until(lambda: "SessionforkQueuePausedTooLong" in live.prometheus.firing(), 30, "the pause's alert firing")
    assert list(live.prometheus.firing()) == ["SessionforkQueuePausedTooLong"]


def test_a_paused_shard_fires_the_paused_alert_and_shows_on_the_pause_panel(live: Live) -> None:
    wait_until(lambda: "SessionforkQueuePausedTooLong" in live.prometheus.firing(), 30,
               "SessionforkQueuePausedTooLong firing")
    (labels,) = live.prometheus.firing()["SessionforkQueuePausedTooLong"]
    assert labels["severity"] == "warning"
    assert live.prometheus.values("sessionfork:queue_paused:max") == [1]


def test_a_real_workers_histograms_carry_the_requests_op(live: Live) -> None:
    for histogram in ("sessionfork_fork_duration_seconds", "sessionfork_fork_latency_seconds"):
        counts = live.prometheus.query(f"sum by (op) ({histogram}_count)")
        assert {labels["op"]: value for labels, value in counts} == {
            "fork": ROUNDS * (OK_PER_ROUND + ERRORS_PER_ROUND), "merge": ROUNDS * 2, "select": 0}, histogram


@pytest.mark.parametrize("record", recording_rules())
def test_every_recording_rule_gives_data_after_real_traffic(live: Live, record: str) -> None:
    wait_until(lambda: live.prometheus.values(record), 30, f"{record} evaluated with a finite value")
    if record in {"sessionfork:forks:rate5m", "sessionfork:merges:rate5m", "sessionfork:fork_errors:ratio_rate5m",
                  "sessionfork:refusals:ratio_rate5m",
                  "sessionfork:fork_latency_seconds:p95_5m", "sessionfork:fork_duration_seconds:p95_5m",
                  "sessionfork:workers_up:sum", "sessionfork:worker_saturation:ratio_rate5m"}:
        assert all(value > 0 for value in live.prometheus.values(record)), record


@pytest.mark.parametrize(("where", "expr"), dashboard_expressions(), ids=[w for w, _ in dashboard_expressions()])
def test_every_dashboard_expression_is_valid_and_gives_data(live: Live, where: str, expr: str) -> None:
    wait_until(lambda: live.prometheus.values(expr), 30, f"{where}: {expr} gives a finite value")


def test_the_worker_serves_its_build_and_process_metrics(live: Live) -> None:
    (labels, value), = live.prometheus.query("sessionfork_build_info")
    assert value == 1 and labels["version"] == sessionfork.__version__ and labels["job"] == JOB
    assert labels["rq_version"] and labels["redis_py_version"] and "unknown" not in labels.values()
    assert live.prometheus.values("process_resident_memory_bytes > 1e6")
    assert live.prometheus.values('python_info{implementation="CPython"}')


def test_the_worker_serves_its_metrics_on_the_address_its_flag_names_only(live: Live) -> None:
    for other in ("127.0.0.1", "127.0.0.3"):  # 0.0.0.0 (the default) would answer on both; .3 is the variable's
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((other, live.port), timeout=5).close()
    assert urllib.request.urlopen(live.metrics_url, timeout=10).status == 200


def test_the_worker_metrics_pass_promtools_lint(live: Live) -> None:
    text = urllib.request.urlopen(live.metrics_url, timeout=10).read()
    lint = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()


def test_no_live_worker_fires_once_the_worker_stops(live: Live) -> None:
    assert stop(live.worker) == 0
    wait_until(lambda: "SessionforkNoLiveWorker" in live.prometheus.firing(), 30, "SessionforkNoLiveWorker firing")
    assert [v for v in live.prometheus.values("sessionfork:workers_up:sum") if not math.isnan(v)] == [0]
