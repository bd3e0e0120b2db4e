"""The compose files are deployable as they stand (Docker cannot run here, so the files are
parsed and their healthcheck commands run): every stateful service keeps its data in a named volume of its
own, every worker serves its metrics on an exposed port that the prometheus service scrapes with the
shipped rules, every service has a healthcheck, and each check's command ends within the check's timeout
even against a dead or hung server (run here against one).
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from sessionfork.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = {"base": ("docker-compose.yml",), "sharded": ("docker-compose.sharded.yml",),
            "sentinel": ("docker-compose.yml", "docker-compose.sentinel.yml")}
"""Each deployment, as the files ``docker compose -f ... up`` is given (the sentinel file overrides the base)."""


def merged(base: Any, override: Any) -> Any:
    """Compose's merge of an override file, enough for these files: mappings merged, anything else replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: merged(base.get(k), v) for k, v in override.items()}}
    return override


def project(name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for file in PROJECTS[name]:
        out = merged(out, yaml.safe_load((ROOT / file).read_text()))
    return out


def seconds(duration: str) -> float:
    found = re.fullmatch(r"(\d+)s", duration)
    assert found is not None, f"a duration in seconds, got {duration!r}"
    return float(found.group(1))


def stateful(services: dict[str, Any]) -> dict[str, Any]:
    """The servers: every service of a Redis image (registry, queue shards, replicas, sentinels)."""
    return {name: s for name, s in services.items() if str(s.get("image", "")).startswith("redis:")}


def workers(services: dict[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in services.items() if s.get("command", [])[:2] == ["sessionfork", "worker"]}


@pytest.mark.parametrize("name", PROJECTS)
def test_every_stateful_service_keeps_its_data_in_a_named_volume_of_its_own(name: str) -> None:
    compose = project(name)
    declared = set(compose.get("volumes") or {})
    servers = stateful(compose["services"])
    assert len(servers) >= {"base": 1, "sharded": 4, "sentinel": 5}[name]
    used: dict[str, str] = {}
    for service, spec in servers.items():
        # The image declares VOLUME /data: without a named volume there, the data sits in an anonymous one
        # that `down`/`up` does not bring back (a queue's 24 h idempotency records, a sentinel's epoch).
        mounts = dict(reversed(str(m).split(":", 1)) for m in spec.get("volumes", []))
        assert mounts.get("/data") in declared, f"{name}: {service} keeps /data in no named volume"
        assert used.setdefault(mounts["/data"], service) == service, f"{service} shares {mounts['/data']}"
    for service, spec in servers.items():
        if "--sentinel" in " ".join(map(str, spec["command"])):  # its rewritten config is its state
            script = spec["command"][-1]
            assert "'dir /data'" in script and "/data/sentinel.conf --sentinel" in script, service
            assert script.startswith("[ -f /data/sentinel.conf ] ||"), f"{service} rewrites its kept config"


@pytest.mark.parametrize("name", PROJECTS)
def test_every_worker_serves_its_metrics_on_an_exposed_port(name: str) -> None:
    found = workers(project(name)["services"])
    assert found, name
    for service, spec in found.items():
        command = spec["command"]
        port = command[command.index("--metrics-port") + 1]
        assert [str(p) for p in spec.get("expose", [])] == [port], f"{service} does not expose {port}"


@pytest.mark.parametrize("name", PROJECTS)
def test_every_service_has_a_healthcheck_whose_command_is_cut_within_its_timeout(name: str) -> None:
    for service, spec in project(name)["services"].items():
        check = spec.get("healthcheck")
        assert check and {"test", "interval", "timeout", "retries"} <= check.keys(), f"{name}: {service}'s check"
        timeout, interval = seconds(check["timeout"]), seconds(check["interval"])
        assert check["retries"] >= 3 and timeout <= interval, service
        assert cut_at(check["test"]) < timeout, f"{name}: {service}'s check is not cut before its timeout"


def cut_at(test: list[str]) -> float:
    """The seconds a check's command is cut at: its ``timeout N`` wrapper (coreutils' or busybox's)."""
    words = test[1].split() if test[0] == "CMD-SHELL" else test[1:]
    assert test[0] in ("CMD", "CMD-SHELL") and words[0] == "timeout", test
    return float(words[1])


# -- the checks' commands, run -----------------------------------------------------------------------


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    """A server that accepts connections and never answers (a hung Redis, sentinel or dashboard)."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as sock:
        yield sock


@pytest.fixture
def hung_port() -> Iterator[Callable[[], int]]:
    """A new ``silent`` server's port at each call (a sharded worker needs one per shard)."""
    with ExitStack() as stack:
        yield lambda: int(stack.enter_context(socket.create_server(("127.0.0.1", 0), backlog=64)).getsockname()[1])


def refused_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def pointed_at(env: dict[str, Any], port: Callable[[], int]) -> dict[str, str]:
    """A service's environment with each ``host:port`` it names replaced by ``127.0.0.1:<port()>``."""
    return {k: re.sub(r"[a-z][a-z0-9-]*:\d+", lambda _: f"127.0.0.1:{port()}", str(v)) for k, v in env.items()}


def run_check(test: list[str], env: dict[str, str], path: str | None = None) -> tuple[int, float, str]:
    """A check's command as Docker runs it (``CMD``: the words; ``CMD-SHELL``: ``sh -c``): exit, seconds, output."""
    argv = ["sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]
    argv = [sys.executable if word == "python" else word for word in argv]
    started = time.monotonic()
    path = path or f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # this venv's sessionfork
    done = subprocess.run(argv, env={"PATH": path, **env}, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    return done.returncode, time.monotonic() - started, done.stdout + done.stderr


def side_by_side(runs: list[tuple[list[str], dict[str, str], str | None]]) -> list[tuple[int, float, str]]:
    """``run_check`` of each run at once (each mostly waits on sockets or a timeout)."""
    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda run: run_check(*run), runs))


@pytest.mark.serial  # asserts time bounds
def test_the_workers_checks_end_within_their_timeout_and_answer_for_themselves_on_a_live_server(
        hung_port: Callable[[], int]) -> None:
    found = {name: next(iter(workers(project(name)["services"]).values())) for name in PROJECTS}
    with EmbeddedServer() as server:  # live, with no worker: health's own verdict, not the cut
        cases = [(f"{name} {why}", spec, port) for name, spec in found.items()
                 for why, port in (("hung", hung_port), ("refused", refused_port))]
        cases.append(("base live", found["base"], lambda: server.port))
        results = side_by_side([(spec["healthcheck"]["test"], pointed_at(spec["environment"], port), None)
                                for _, spec, port in cases])
    for (where, spec, _), (code, took, output) in zip(cases, results, strict=True):
        assert code not in (0, 2) and took < seconds(spec["healthcheck"]["timeout"]), (where, code, took, output)
    assert (results[-1][0], "unhealthy: no worker" in results[-1][2]) == (1, True), results[-1]  # not the cut


FAKE_CLI = '''#!{python}
"""redis-cli as the checks call it: [-p PORT] ping, to 127.0.0.1 at $FAKE_PORT_<PORT>; waits as long as it takes."""
import os, socket, sys
args = sys.argv[1:]
port = args[args.index("-p") + 1] if "-p" in args else "6379"
with socket.create_connection(("127.0.0.1", int(os.environ["FAKE_PORT_" + port]))) as sock:
    sock.sendall(b"PING\\r\\n")
    print(sock.makefile("rb").readline().decode().strip().lstrip("+-"))
'''


def distinct_checks(kind: Any) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each distinct check of the services ``kind`` picks, over every project: its text -> (service, check)."""
    return {str(s["healthcheck"]["test"]): (s, s["healthcheck"])
            for name in PROJECTS for s in kind(project(name)["services"]).values()}


@pytest.mark.serial  # asserts time bounds
def test_the_servers_checks_pass_on_a_live_server_and_end_within_their_timeout_on_a_hung_one(
        silent: socket.socket, tmp_path: Path) -> None:
    fake = tmp_path / "redis-cli"  # redis-cli is in the Redis image, not necessarily here
    fake.write_text(FAKE_CLI.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    path = f"{tmp_path}{os.pathsep}{os.environ['PATH']}"
    checks = distinct_checks(stateful)
    assert len(checks) == 2  # a server's and a sentinel's
    with EmbeddedServer() as server:
        cases = [(spec, check, target, healthy) for spec, check in checks.values()
                 for target, healthy in ((server.port, True), (silent.getsockname()[1], False),
                                         (refused_port(), False))]
        ports = ["26379" if "--sentinel" in " ".join(map(str, spec["command"])) else "6379" for spec, *_ in cases]
        results = side_by_side([(check["test"], {f"FAKE_PORT_{port}": str(target)}, path)
                                for (_, check, target, _), port in zip(cases, ports, strict=True)])
    for (_, check, target, healthy), (code, took, output) in zip(cases, results, strict=True):
        assert (code == 0) == healthy and took < seconds(check["timeout"]), (check["test"], target, output)


@pytest.mark.serial  # asserts time bounds
def test_the_dashboards_check_fails_within_its_timeout_on_a_hung_or_missing_dashboard(silent: socket.socket) -> None:
    checks = distinct_checks(lambda services: {"dashboard": services["dashboard"]})
    cases = [(check, port) for _, check in checks.values() for port in (silent.getsockname()[1], refused_port())]
    results = side_by_side([([w.replace(":9181/", f":{port}/") for w in check["test"]], {}, None)
                            for check, port in cases])
    for (check, port), (code, took, output) in zip(cases, results, strict=True):
        assert code != 0 and took < seconds(check["timeout"]), (port, code, took, output)


# -- Prometheus -------------------------------------------------------------------------


def config_of(spec: dict[str, Any]) -> Path:
    """The repository file a prometheus service runs with: its ``--config.file``, through its mounts."""
    mounts = {target: source for source, target, *_ in (str(m).split(":") for m in spec["volumes"])}
    flag = next(word for word in spec["command"] if word.startswith("--config.file="))
    path = flag.partition("=")[2]
    folder = next(target for target in mounts if path.startswith(target + "/"))
    return ROOT / mounts[folder] / path[len(folder) + 1:]


@pytest.mark.parametrize("name", PROJECTS)
def test_prometheus_scrapes_every_worker_with_the_shipped_rules(name: str) -> None:
    compose = project(name)
    services = compose["services"]
    prometheus = services["prometheus"]
    assert str(prometheus["image"]).startswith("prom/prometheus:")
    assert "./deploy/prometheus:/etc/prometheus/sessionfork:ro" in prometheus["volumes"]  # config and rules/
    assert "prometheus-data:/prometheus" in prometheus["volumes"] and "prometheus-data" in compose["volumes"]
    config = yaml.safe_load(config_of(prometheus).read_text())
    assert config["rule_files"] == ["rules/*.yml"]  # beside the config: deploy/prometheus/rules
    (job,) = config["scrape_configs"]
    scraped = {(target, sd["port"]) for sd in job["dns_sd_configs"] for target in sd["names"]}
    served = {(service, int(spec["command"][spec["command"].index("--metrics-port") + 1]))
              for service, spec in workers(services).items()}
    assert job["job_name"] == "sessionfork" and scraped == served, (scraped, served)


@pytest.mark.serial  # asserts time bounds
def test_the_prometheus_check_passes_on_a_ready_server_and_fails_within_its_timeout_on_a_hung_or_missing_one(
        silent: socket.socket) -> None:
    from prometheus import PrometheusServer, shipped_rules

    checks = distinct_checks(lambda services: {"prometheus": services["prometheus"]})
    with PrometheusServer([], shipped_rules()) as live:
        cases = [(check, port, healthy) for _, check in checks.values()
                 for port, healthy in ((live.port, True), (silent.getsockname()[1], False), (refused_port(), False))]
        results = side_by_side([([w.replace(":9090/", f":{port}/") for w in check["test"]], {}, None)
                                for check, port, _ in cases])
    for (check, port, healthy), (code, took, output) in zip(cases, results, strict=True):
        assert (code == 0) == healthy and took < seconds(check["timeout"]), (port, code, took, output)
