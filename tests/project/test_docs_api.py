"""The examples teach the public, typed API: every Python example of README.md and docs/*.md
passes ``mypy --strict`` (as a user's own code would be checked), and none imports or names a
private module (``sessionfork.core``, ``.protocol``, ``.ops``, ``.worker``, ``.clients``, ``.cli``).

A page's blocks run as one script (tests/project/test_docs.py), a later block using an earlier
one's names, so each page is one module here; one mypy run checks them all, and an error names
the page, the block and the line in it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import sessionfork

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PRIVATE = re.compile(r"\bsessionfork\.(core|protocol|queue|ops|worker|clients|cli)\b")
PRIVATE_PATH = re.compile(r"\bsessionfork(?:\.\w+)*\.(core|protocol|queue|ops|worker|clients|cli)"
                          r"(?:\.\w+)*\.(\w+)\b")
"""A dotted path through a private module; group 2 is the name it ends with."""
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)


def blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text())


def page_modules(pages: list[Path], into: Path, root: Path = ROOT) -> dict[str, list[tuple[str, int, int]]]:
    """Each page's blocks written to ``into`` as one module; per module, each line's origin:
    ``(page, relative to root, block number from 1, line in the block from 1)``."""
    origins: dict[str, list[tuple[str, int, int]]] = {}
    for path in pages:
        found = blocks(path)
        if not found:
            continue
        name = re.sub(r"\W", "_", path.relative_to(root).with_suffix("").as_posix()).lower() + ".py"
        lines, where = [], []
        for number, block in enumerate(found, 1):
            for offset, line in enumerate(block.splitlines(), 1):
                lines.append(line)
                where.append((path.relative_to(root).as_posix(), number, offset))
        (into / name).write_text("\n".join(lines) + "\n")
        origins[name] = where
    return origins


def mypy_strict(folder: Path) -> subprocess.CompletedProcess[str]:
    src = Path(sessionfork.__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-version", "3.11",
                           "--no-error-summary", "--show-error-codes", "."], capture_output=True, text=True,
                          timeout=300, cwd=folder, env={**os.environ, "MYPYPATH": str(src)})


def located(output: str, origins: dict[str, list[tuple[str, int, int]]]) -> list[str]:
    """mypy's error lines, each told as ``page, python block N, line L: message``."""
    found = []
    for line in output.splitlines():
        match = re.match(r"(\S+\.py):(\d+): error: (.*)", line)
        if match:
            page, block, at = origins[match[1]][int(match[2]) - 1]
            found.append(f"{page}, python block {block}, line {at}: {match[3]}")
    return found


def test_every_python_example_passes_mypy_strict(tmp_path: Path) -> None:
    origins = page_modules(PAGES, tmp_path)
    assert {"readme.py", "docs_getting_started.py", "docs_schedulers.py", "docs_agent_hosts.py"} <= set(origins)
    done = mypy_strict(tmp_path)
    errors = located(done.stdout, origins)
    assert errors == [], "\n".join(errors)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_type_error_in_an_example_is_found_and_named_by_page_and_block(tmp_path: Path) -> None:
    """The check above sees what a user's mypy sees: a reply read without narrowing is an error,
    told with its page and block."""
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nx = 1\n```\n\n```python\nfrom sessionfork.client import Client, Reply\n\n"
                    "def first(reply: Reply) -> str:\n    return reply.child.id\n```\n")
    folder = tmp_path / "modules"
    folder.mkdir()
    origins = page_modules([page], folder, tmp_path)
    done = mypy_strict(folder)
    errors = located(done.stdout, origins)
    assert len(errors) == 1 and errors[0].startswith("page.md, python block 2, line 4: "), done.stdout + done.stderr
    assert 'Item "ForkFailure" of "ForkResult | ForkFailure" has no attribute "child"' in errors[0], errors


def test_no_example_imports_or_names_a_private_module() -> None:
    named = [(path.relative_to(ROOT).as_posix(), number, line.strip())
             for path in PAGES for number, block in enumerate(blocks(path), 1)
             for line in block.splitlines() if PRIVATE.search(line)]
    assert named == []


def test_no_page_teaches_a_private_path_to_a_public_name() -> None:
    """What the public modules export is named by its public path: ``sessionfork.fork_many``,
    never ``sessionfork.core.forks.fork_many`` (nor ``protocol.shards.shard_of``, ``ops.diff.diff``...)."""
    import sessionfork.aio
    import sessionfork.client
    import sessionfork.embedded

    public = {name for module in (sessionfork, sessionfork.client, sessionfork.aio, sessionfork.embedded)
              for name in module.__all__}
    taught = [(path.relative_to(ROOT).as_posix(), match[0])
              for path in PAGES for match in PRIVATE_PATH.finditer(path.read_text()) if match[2] in public]
    assert taught == []
