"""Debian's Prometheus for the tests of what deploy/ ships: ``promtool``, a throwaway server on a
free port scraping the targets a test names with the shipped rules, and its HTTP API.

The shipped rules are tested as they are, but for how long an alert's condition must hold before it
fires: ``with_for`` gives the rule file with every alert's ``for`` replaced (the tests use ``0s``, so
an alert fires at the first evaluation that sees its condition), every expression unchanged.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from waits import wait_until

from sessionfork.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "sessionfork.rules.yml"
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))
DASHBOARD = ROOT / "deploy" / "grafana" / "sessionfork.json"
JOB = "sessionfork"
"""The scrape job the rules read ``up`` of (the shipped Prometheus configs name theirs so)."""


def tool(name: str) -> str:
    """The path of ``prometheus`` or ``promtool`` (Debian's ``prometheus`` package; ``run.py test``
    installs it), or ``RuntimeError`` saying how to install it."""
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: Debian's prometheus package is needed (apt-get install -y prometheus;"
                           " python3 run.py test installs it)")
    return found


def with_for(rules: dict[str, Any], duration: str) -> dict[str, Any]:
    """The parsed rule file ``rules`` with every alert's ``for`` set to ``duration``; nothing else changed."""
    return {**rules, "groups": [{**group, "rules": [{**rule, "for": duration} if "alert" in rule else rule
                                                    for rule in group["rules"]]}
                                for group in rules["groups"]]}


def shipped_rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return loaded


def recording_rules() -> list[str]:
    """The name of every shipped recording rule."""
    return [rule["record"] for group in shipped_rules()["groups"] for rule in group["rules"] if "record" in rule]


def dashboard_expressions() -> list[tuple[str, str]]:
    """Every PromQL expression of the shipped Grafana dashboard: (where, expr), the panels' targets
    and the annotations, each dashboard variable replaced by its "All" value (``allValue``)."""
    board = json.loads(DASHBOARD.read_text())
    found = [(f"panel {panel['title']!r} {target['refId']}", target["expr"])
             for panel in board["panels"] for target in panel["targets"]]
    found += [(f"annotation {a['name']!r}", a["expr"]) for a in board["annotations"]["list"] if "expr" in a]
    every = {v["name"]: v["allValue"] for v in board["templating"]["list"] if v.get("includeAll")}
    for name, value in every.items():  # each variable as Grafana's "All" gives it
        found = [(where, expr.replace(f"${name}", value)) for where, expr in found]
    return found


class PrometheusServer:
    """``prometheus`` on 127.0.0.1 and a free port, scraping ``targets`` as job ``sessionfork`` every
    second and evaluating ``rules`` (a parsed rule file) every second, its data in a temporary folder."""

    def __init__(self, targets: list[str], rules: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="sf-prometheus-")
        folder = Path(self._dir.name)
        (folder / "rules.yml").write_text(yaml.safe_dump(rules))
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
                  "rule_files": ["rules.yml"],
                  "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}]}
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (folder / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, cwd=folder)

    def __enter__(self) -> PrometheusServer:
        try:
            wait_until(self._ready, 30, f"prometheus ready on {self.url}", interval=0.05)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        self.log.close()
        self._dir.cleanup()

    def _ready(self) -> bool:
        assert self.process.poll() is None, f"prometheus exited with {self.process.returncode}: {self.output()}"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-4000:]

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of ``GET /api/v1/<path>``; an error status fails the test with the server's words."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        assert body["status"] == "success", f"{path} {params}: {body.get('errorType')}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """The instant vector ``expr`` evaluates to now: (labels, value) of each series."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]

    def values(self, expr: str) -> list[float]:
        """The finite values of ``expr`` now (NaN, as 0/0 gives, left out)."""
        return [value for _, value in self.query(expr) if math.isfinite(value)]

    def firing(self) -> dict[str, list[dict[str, str]]]:
        """The alerts firing now: alert name -> the labels of each."""
        found: dict[str, list[dict[str, str]]] = {}
        for alert in self.api("alerts")["alerts"]:
            if alert["state"] == "firing":
                found.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return found
