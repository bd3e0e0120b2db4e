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
    assert worker["command"] == ["sessionfork", "worker"]
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
    """The test command does its own set-up (run.ensure_browser), so CI is that command alone."""
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines == ['cd "$(dirname "$0")/.." && CI="${CI:-true}" exec python3 run.py test']
    assert "Debian's `chromium`" in (ROOT / "README.md").read_text()
