"""``python3 run.py test`` does its own set-up: the system packages first, then the docs build.

``run.ensure_system_packages`` installs Debian's ``chromium`` (the headless browser),
``prometheus`` (the server and promtool), ``nodejs`` and ``npm`` (the TypeScript client's build and
tests) with one apt-get when any is missing and this runs as root; otherwise it installs nothing and
the command stops, with a one-line instruction, before running anything. Fakes stand in for PATH,
apt-get and the steps (nothing is installed or run here).
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import run

PROMETHEUS = {"prometheus", "promtool"}
NODE = {"node", "npm"}


class Apt:
    """A fake ``subprocess.run`` for apt-get: records each command; ``install`` puts what it names on PATH
    (chromium; prometheus as its two commands)."""

    def __init__(self, path: set[str], fail: bool = False) -> None:
        self.path, self.fail, self.calls = path, fail, []  # type: list[tuple[list[str], dict[str, str]]]

    def __call__(self, cmd: list[str], env: dict[str, str], **output: Any) -> Any:
        assert output == {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
        self.calls.append((cmd, env))
        if "install" in cmd and not self.fail:
            for package in cmd[cmd.index("-qq") + 1:]:
                self.path |= PROMETHEUS if package == "prometheus" else {package}
        return subprocess.CompletedProcess(cmd, 1 if self.fail else 0, stdout="E: apt says why" if self.fail else "")

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.path else None


def test_present_packages_need_nothing() -> None:
    for name in run.BROWSERS:
        apt = Apt({name, "apt-get", *PROMETHEUS, *NODE})
        assert run.ensure_system_packages(apt.which, is_root=True, sh=apt) is None
        assert apt.calls == []


def test_as_root_a_missing_browser_is_installed_with_apt_get_non_interactively() -> None:
    apt = Apt({"apt-get", *PROMETHEUS, *NODE})
    assert run.ensure_system_packages(apt.which, is_root=True, sh=apt) is None
    assert [cmd for cmd, _ in apt.calls] == [["apt-get", "update", "-qq"],
                                             ["apt-get", "install", "-y", "-qq", "chromium"]]
    assert all(env["DEBIAN_FRONTEND"] == "noninteractive" for _, env in apt.calls)
    assert "chromium" in apt.path


@pytest.mark.parametrize("present", [set(), {"prometheus"}, {"promtool"}])
def test_as_root_prometheus_without_either_command_is_installed(present: set[str]) -> None:
    apt = Apt({"apt-get", "chromium", *NODE, *present})
    assert run.ensure_system_packages(apt.which, is_root=True, sh=apt) is None
    assert [cmd for cmd, _ in apt.calls] == [["apt-get", "update", "-qq"],
                                             ["apt-get", "install", "-y", "-qq", "prometheus"]]
    assert apt.path >= PROMETHEUS


def test_as_root_all_missing_are_installed_by_one_apt_get() -> None:
    apt = Apt({"apt-get"})
    assert run.ensure_system_packages(apt.which, is_root=True, sh=apt) is None
    assert [cmd for cmd, _ in apt.calls] == [["apt-get", "update", "-qq"],
                                             ["apt-get", "install", "-y", "-qq", "chromium", "prometheus", "nodejs",
                                              "npm"]]
    assert run.missing_packages(apt.which) == []


def test_without_root_nothing_is_installed_and_the_instruction_is_one_line() -> None:
    apt = Apt({"apt-get"})
    hint = run.ensure_system_packages(apt.which, is_root=False, sh=apt)
    assert apt.calls == []
    assert hint is not None and "\n" not in hint
    assert "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium prometheus nodejs npm" in hint
    only = run.ensure_system_packages(Apt({"apt-get", "chromium", *NODE}).which, is_root=False, sh=apt)
    assert only is not None and only.endswith(
        "apt-get install -y -qq prometheus` (as root), then run python3 run.py test again")


def test_a_failed_install_or_no_apt_get_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    apt = Apt({"apt-get"}, fail=True)
    assert "apt-get update -qq failed" in (run.ensure_system_packages(apt.which, is_root=True, sh=apt) or "")
    assert "E: apt says why" in capsys.readouterr().err
    no_apt = Apt(set())
    assert run.ensure_system_packages(no_apt.which, is_root=True, sh=no_apt) == run.install_hint(
        ["chromium", "prometheus", "nodejs", "npm"])
    assert no_apt.calls == []


def test_the_test_command_stops_before_anything_when_a_system_package_cannot_be_had(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[str] = []
    monkeypatch.setattr(run, "ensure_system_packages", lambda: run.install_hint(["chromium"]))
    monkeypatch.setattr(run, "ensure_env", lambda *a: ran.append("ensure_env") or Path("/nonexistent"))
    monkeypatch.setattr(run, "run", lambda *cmd, env=None: ran.append(" ".join(cmd)) or 0)
    assert run.main(["test"]) == 1
    assert ran == []
    assert capsys.readouterr().err.strip() == run.install_hint(["chromium"])


def test_the_test_command_sets_up_the_system_packages_then_builds_the_docs_strictly_before_pytest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(run, "ensure_system_packages", lambda: ran.append("browser") and None)
    monkeypatch.setattr(run, "ensure_env", lambda *a: ran.append("env") or Path("/venv/bin"))
    monkeypatch.setattr(run, "run", lambda *cmd, env=None: ran.append(" ".join(cmd)) or 0)
    assert run.main(["test", "tests/unit"]) == 0
    assert ran[:2] == ["browser", "env"]
    steps = [cmd.split()[0].rsplit("/", 1)[-1] for cmd in ran[2:]]
    assert steps == ["ruff", "mypy", "python"]
    assert ran[4] == "/venv/bin/python -m pytest tests/unit"


def test_the_docs_build_is_a_test_of_the_suite_it_runs() -> None:
    """The site's strict build is no step of its own (it was built twice): a test of the suite runs it,
    so a broken link fails the test command as any failed test does."""
    source = (Path(run.ROOT) / "tests" / "project" / "test_docs.py").read_text()
    assert "def test_the_site_builds_strictly_and_a_broken_link_anchor_or_reference_fails_it" in source
    assert "run.docs_build" in source or "docs_build(" in source


class _Started:
    def __init__(self, status: int) -> None:
        self.status = status

    def wait(self) -> int:
        return self.status


def _recorded(monkeypatch: pytest.MonkeyPatch, fail: str = "") -> list[tuple[str, dict[str, str] | None]]:
    ran: list[tuple[str, dict[str, str] | None]] = []
    monkeypatch.setattr(run, "ensure_system_packages", lambda: None)
    monkeypatch.setattr(run, "ensure_env", lambda *a: Path("/rq2/bin" if a and a[0] == ".venv-rq2" else "/venv/bin"))

    def record(*cmd: str, env: dict[str, str] | None = None, stdout: object = None) -> int:
        ran.append((" ".join(cmd), env))
        return int(bool(fail) and fail in ran[-1][0])

    monkeypatch.setattr(run, "run", record)
    monkeypatch.setattr(run, "start", lambda *cmd, env=None, stdout=None: _Started(record(*cmd, env=env)))
    return ran


def test_the_whole_suite_runs_in_parallel_then_the_serial_tests_in_one_process_on_each_rq(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Both parallel phases at once (RQ 2.12's after its mypy), then both serial phases at once, in
    one process each (RQ 2.12's started first, the current RQ's run beside it)."""
    ran = _recorded(monkeypatch)
    assert run.main(["test"]) == 0
    steps = [cmd for cmd, _ in ran if " -m pytest" in cmd or cmd.endswith("/mypy")]
    assert steps == [
        "/venv/bin/mypy",
        f"/venv/bin/python -m pytest -n {run.PARALLEL} --dist loadfile -m not serial --durations=25",
        "/rq2/bin/mypy",
        f"/rq2/bin/python -m pytest -n {run.PARALLEL_RQ2} --dist loadfile -m rq and not serial --durations=25",
        "/rq2/bin/python -m pytest -m rq and serial --durations=25",
        "/venv/bin/python -m pytest -m serial --durations=25"]
    envs = {cmd: env for cmd, env in ran if " -m pytest" in cmd}
    assert [env for cmd, env in envs.items() if cmd.startswith("/rq2/")] == [{"SESSIONFORK_EXPECT_RQ": "2"}] * 2
    assert [env for cmd, env in envs.items() if cmd.startswith("/venv/")] == [None, None]


@pytest.mark.parametrize("failing", ["-m not serial", "-m rq and not serial", "/rq2/bin/mypy"])
def test_a_failed_parallel_phase_stops_the_suite_before_the_serial_ones(monkeypatch: pytest.MonkeyPatch,
                                                                         failing: str) -> None:
    ran = _recorded(monkeypatch, fail=failing)
    assert run.main(["test"]) == 1
    assert not [cmd for cmd, _ in ran if cmd.endswith("-m serial --durations=25") or "and serial" in cmd]


@pytest.mark.parametrize("failing", ["-m serial", "-m rq and serial"])
def test_a_failed_serial_phase_on_either_rq_fails_the_suite(monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    ran = _recorded(monkeypatch, fail=failing)
    assert run.main(["test"]) == 1
    assert [cmd for cmd, _ in ran if "and serial" in cmd] and [cmd for cmd, _ in ran if " -m serial" in cmd]


def test_the_two_phases_select_every_test_once() -> None:
    """``not serial`` and ``serial``: each test is in exactly one of them, and the serial marker is
    the registered one (``--strict-markers`` would fail a misspelt one)."""
    parallel, serial = run.phases()
    assert parallel[parallel.index("-m") + 1] == "not " + serial[serial.index("-m") + 1] == "not serial"
    assert "serial:" in (Path(run.ROOT) / "pyproject.toml").read_text()
    parallel, serial = run.phases("rq")
    assert (parallel[parallel.index("-m") + 1], serial[serial.index("-m") + 1]) == \
        ("rq and not serial", "rq and serial")
    assert '"rq:' in (Path(run.ROOT) / "pyproject.toml").read_text()


def test_the_demo_installs_only_the_embedded_server_and_the_test_command_the_test_and_docs_tools(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The docs tools sit in their own extra, so the demo's venv stays small; an env
    set up for the tests serves the demo as it is (no second install)."""
    installed: list[str] = []
    (tmp_path / "pyproject.toml").write_bytes((run.ROOT / "pyproject.toml").read_bytes())
    monkeypatch.setattr(run, "ROOT", tmp_path)
    monkeypatch.setattr(run.venv, "EnvBuilder", lambda **_: type("B", (), {"create": staticmethod(
        lambda env: (Path(env) / run.BIN_DIR).mkdir(parents=True) or (Path(env) / run.BIN_DIR / "python").touch())}))
    monkeypatch.setattr(run.subprocess, "run", lambda cmd, check: installed.append(cmd[-1]))
    run.ensure_env(".venv", extras=run.DEMO_EXTRAS)
    assert installed[-1] == f"{tmp_path}[embedded]"
    run.ensure_env(".venv")
    assert installed[-1] == f"{tmp_path}[test,docs,console,langgraph]"
    count = len(installed)
    run.ensure_env(".venv", extras=run.DEMO_EXTRAS)
    run.ensure_env(".venv")
    assert len(installed) == count  # stamped: nothing installed again
    extras = tomllib.loads((run.ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {d.split(">")[0].split("[")[0] for d in extras["docs"]} == {"mkdocs", "mkdocs-material", "mkdocstrings"}
    assert not any(d.startswith("mkdocs") for d in extras["test"] + extras["embedded"])


def test_the_demo_and_the_worker_set_up_the_small_env(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(run, "ensure_env", lambda *a, extras=run.TEST_EXTRAS: asked.append(extras) or Path("/v/bin"))
    monkeypatch.setattr(run, "run", lambda *cmd, env=None: 0)
    assert run.main(["demo"]) == 0 and run.main(["worker", "--burst"]) == 0
    assert asked == [run.DEMO_EXTRAS, run.DEMO_EXTRAS]
