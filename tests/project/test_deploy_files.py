"""Deployment files parse and start the same worker (no Docker engine needed)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_procfile_worker_line_runs_the_worker() -> None:
    lines = dict(line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip())
    assert lines["worker"].strip() == "sessionfork worker"


def test_compose_redis_has_a_healthcheck() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    check = compose["services"]["redis"]["healthcheck"]["test"]
    assert "ping" in " ".join(check)


def test_compose_worker_waits_for_healthy_redis() -> None:
    worker = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["command"][:2] == ["sessionfork", "worker"]
    assert worker["environment"]["REDIS_URL"].startswith("redis://redis:")


def test_compose_dashboard_reads_json_jobs() -> None:
    dashboard = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["dashboard"]
    assert "--json" in dashboard["command"]


def test_worker_module_starts_the_worker_command() -> None:
    source = (ROOT / "worker" / "__main__.py").read_text()
    assert '"worker"' in source and "from sessionfork.cli import main" in source


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 run.py test" in readme
    assert "python3 run.py test" in ci


def test_compose_restarts_a_worker_that_failed() -> None:
    worker = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    assert worker["restart"] == "on-failure"


def test_ci_is_one_call_of_the_test_command_with_ci_set() -> None:
    """The test command does its own set-up (run.ensure_system_packages), so CI is that command alone."""
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines == ['cd "$(dirname "$0")/.." && CI="${CI:-true}" exec python3 run.py test']
    assert "Debian's `chromium`" in (ROOT / "README.md").read_text()


def test_compose_sentinel_variant_points_workers_and_dashboard_at_the_monitored_primary() -> None:
    """docker-compose.sentinel.yml: a replica of ``redis``, three sentinels watching it under the
    service the workers' and the dashboard's one Sentinel URL names, a quorum of two."""
    from sessionfork.core.config import parse_sentinel_url

    base = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    override = yaml.safe_load((ROOT / "docker-compose.sentinel.yml").read_text())["services"]
    url = override["worker"]["environment"]["REDIS_URL"]
    parsed = parse_sentinel_url(url, "REDIS_URL")
    sentinels = [name for name in override if name.startswith("sentinel-")]
    assert [host for host, _ in parsed.sentinels] == sentinels and len(sentinels) == 3
    for name in sentinels:
        script = override[name]["command"][-1]
        assert f"'sentinel monitor {parsed.service} redis 6379 2'" in script
        assert script.endswith("--sentinel") and "'port 26379'" in script
        assert override[name]["healthcheck"]["test"][-1].endswith("redis-cli -p 26379 ping | grep -q PONG")
    replica = override["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1:][:2] == ["redis", "6379"]
    assert all(override["worker"]["depends_on"][s]["condition"] == "service_healthy" for s in sentinels)
    dashboard = override["dashboard"]["command"]
    assert dashboard[dashboard.index("--redis-url") + 1] == url
    assert set(base["dashboard"]["command"]) - {base["dashboard"]["command"][2]} <= set(dashboard)
    assert "redis" in base and "worker" in base  # the override adds to the base file's services


def test_compose_sharded_variant_gives_each_worker_its_shard_of_one_list() -> None:
    """docker-compose.sharded.yml: every worker lists the same queue servers in the same order,
    serves its own shard (SESSIONFORK_SHARD, which its healthcheck reads too) and waits for that
    shard's server; the settings parse; the dashboard shows every shard in shard order."""
    from sessionfork.core import config

    services = yaml.safe_load((ROOT / "docker-compose.sharded.yml").read_text())["services"]
    queues = sorted(name for name in services if name.startswith("queue-"))
    workers = sorted(name for name in services if name.startswith("worker-"))
    urls = [f"redis://{name}:6379/0" for name in queues]
    assert len(queues) == len(workers) == 3
    for index, name in enumerate(workers):
        worker = services[name]
        settings = config.from_environ(worker["environment"])
        assert settings.queue_urls == tuple(urls) and settings.shard == index
        assert worker["depends_on"][queues[index]]["condition"] == "service_healthy"
        assert worker["command"][:2] == ["sessionfork", "worker"]
        assert worker["healthcheck"]["test"][-2:] == ["sessionfork", "health"]
    command = services["dashboard"]["command"]
    assert [command[i + 1] for i, arg in enumerate(command) if arg == "--redis-url"] == urls
