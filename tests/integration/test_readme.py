"""The README is the contract: its Python examples run, its CLI table and settings table match the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from sessionfork.cli import cli
from sessionfork.core import config
from sessionfork.embedded import EmbeddedServer

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_python_examples_run_against_a_real_server_and_worker(server: EmbeddedServer) -> None:
    with server.client() as setup:
        setup.flushall()
    script = "\n".join(python_blocks()).replace("redis://localhost:6379/0", server.url)
    script += "\nassert reply.ok, reply\nprint('examples ok')\n"
    worker = subprocess.Popen([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "worker",
                               "--name", "readme-worker", "--log-level", "WARNING"])
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    finally:
        worker.terminate()
        assert worker.wait(30) == 0
    assert out.returncode == 0, out.stderr
    assert 'cannot fork session "sess-b" inside an open turn (last event: tool/call)' in out.stdout
    assert 'cannot fork session "sess-c" at boundary 4: inside the turn opened at seq 3' in out.stdout
    assert out.stdout.rstrip().endswith("examples ok")


def test_every_command_in_the_readme_table_exists() -> None:
    table = README[README.index("## The command line"):README.index("## Running workers")]
    documented = set(re.findall(r"^\| `([a-z]+)", table, flags=re.M))
    listed = CliRunner().invoke(cli, ["--help"]).output
    commands = set(re.findall(r"^  ([a-z]+) ", listed[listed.index("Commands:"):], flags=re.M))
    assert documented == commands


def test_every_setting_is_documented_with_its_default() -> None:
    table = README[README.index("## Configuration"):README.index("## Deployment")]
    documented = set(re.findall(r"^\| `([A-Z_]+)`", table, flags=re.M))
    assert documented == set(config.ENV.values())
    defaults = config.Settings()
    for field, var in config.ENV.items():
        value = getattr(defaults, field)
        if isinstance(value, int) and not isinstance(value, bool):
            assert re.search(rf"^\| `{var}` \| {value} \|", table, flags=re.M), var
    for field, (low, high) in config.BOUNDS.items():  # the range column states the checked bounds
        shown = "\u2013".join(str(int(b)) if float(b).is_integer() else str(b) for b in (low, high))
        assert re.search(rf"^\| `{config.ENV[field]}` \| [^|]+ \| {shown} \|", table, flags=re.M), field


def test_every_error_code_is_documented() -> None:
    from sessionfork import ErrorCode

    for code in ErrorCode:
        assert f"| `{code.value}` |" in README
