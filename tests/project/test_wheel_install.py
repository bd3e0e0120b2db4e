"""The install story (docs/getting-started.md#install): the wheel builds from a checkout as the
page says, installs into a fresh venv, runs ``sessionfork --help`` and imports from there, and holds every Lua
script, ``py.typed`` and the LICENSE. Offline: the build uses this venv's setuptools (``--no-build-isolation``)
and the fresh venv takes the dependencies from this venv's site-packages (a ``.pth`` line), not from an index.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "sessionfork"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"sessionfork-{VERSION}-py3-none-any.whl"


def documented_commands() -> list[str]:
    """The Install section's commands (getting-started.md), the wheel's name as the page spells it."""
    text = (ROOT / "docs" / "getting-started.md").read_text()
    section = text.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)
    assert block is not None
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines()]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built as the page says, from a copy of the checkout (a build writes beside the sources)."""
    tree = tmp_path_factory.mktemp("checkout")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    build = documented_commands()[0]
    assert build == "python -m pip wheel --no-deps -w dist ."
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "--disable-pip-version-check", "-w", "dist", "."], cwd=tree, check=True, timeout=300)
    wheel = tree / "dist" / WHEEL
    assert wheel.exists(), sorted(p.name for p in (tree / "dist").iterdir())
    return wheel


def test_the_wheel_holds_every_lua_script_py_typed_and_the_license(built: Path) -> None:
    with zipfile.ZipFile(built) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"sessionfork-{VERSION}.dist-info/METADATA").decode()
    shipped = {f"sessionfork/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*.lua")}
    assert shipped and shipped == {n for n in names if n.endswith(".lua")}
    assert {"sessionfork/protocol/scripts/outcome.lua", "sessionfork/core/scripts/lib/header.lua"} <= shipped
    assert "sessionfork/py.typed" in names
    console = {f"sessionfork/{p.relative_to(PACKAGE).as_posix()}" for folder in ("templates", "static")
               for p in (PACKAGE / "console" / folder).iterdir()}
    assert "sessionfork/console/static/live.js" in console and console <= names  # the console's pages
    assert f"sessionfork-{VERSION}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: MIT" in metadata.splitlines()
    modules = {f"sessionfork/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*.py")}
    assert modules <= names


def test_the_wheel_installs_in_a_fresh_venv_and_runs_from_there(built: Path, tmp_path: Path) -> None:
    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(fresh)  # no ensurepip: this venv's pip installs into it
    bin_dir = fresh / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    install = documented_commands()[1]
    assert install.endswith(f"pip install dist/{WHEEL}"), install
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--quiet", "--disable-pip-version-check", str(built)], check=True, timeout=300)
    # The dependencies (redis, rq, msgspec, click, prometheus-client) from this venv, as an index would
    # give them: a .pth line puts its site-packages after the fresh venv's (its own .pth files, the
    # editable install of the checkout among them, are not read).
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    (site / "_deps_from_test_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}

    helped = subprocess.run([str(bin_dir / "sessionfork"), "--help"], capture_output=True, text=True, env=env,
                            timeout=60, cwd=tmp_path)
    assert helped.returncode == 0 and "Usage: sessionfork" in helped.stdout, helped.stderr
    assert documented_commands()[2].endswith("sessionfork --help")
    probe = ("import sessionfork, sessionfork.client, sessionfork.aio\n"
             "from sessionfork.core import lua\n"
             "from sessionfork.protocol import enqueue\n"
             "assert all(lua.source(s.name + '.lua', s.package) for s in lua.SCRIPTS.values())\n"
             "assert enqueue.OUTCOME_SOURCE and 'local function header_json' in lua.source('create.lua')\n"
             "print(sessionfork.__file__)\n")
    imported = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env, timeout=60,
                              cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).is_relative_to(site), imported.stdout  # the wheel's, not the checkout's
