"""The code speaks of the product too: the docstrings and comments of src/, tests/, bench/ and worker/
(``.py``, ``.lua``) and the promises and comments of tests/mutations.toml state contracts, never the
history of how the product was built (``test_docs_prose.HISTORY``: an issue number, a "stop" of the work).
A string the code uses (a test's example of a history line, a break's ``new`` text) is not prose.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from pathlib import Path

from test_docs_prose import HISTORY

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["src", "tests", "bench", "worker"]
PATTERN = ROOT / "tests" / "project" / "test_docs_prose.py"
"""The file that defines ``HISTORY``: its docstrings and comments quote what the pattern matches."""
SUFFIXES = {".py", ".lua", ".toml"}


def python_prose(source: str) -> list[str]:
    """The comments and docstrings of a Python module: each comment and each string that stands alone
    as a statement (a module's, a class's, a function's or an attribute's docstring)."""
    comments = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT]
    docstrings = [node.value.value for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str)]
    return comments + docstrings


def lua_prose(source: str) -> list[str]:
    """The comments of a Lua script: from ``--`` to the end of the line."""
    return re.findall(r"--.*", source)


def toml_prose(source: str) -> list[str]:
    """The comments of a TOML file (a line that starts with ``#``) and each table's ``promise``."""
    comments = [line for line in source.splitlines() if line.lstrip().startswith("#")]
    promises = [item["promise"] for items in tomllib.loads(source).values() if isinstance(items, list)
                for item in items if isinstance(item, dict) and "promise" in item]
    return comments + promises


READERS = {".py": python_prose, ".lua": lua_prose, ".toml": toml_prose}


def told(path: Path) -> list[str]:
    """Each line of ``path``'s prose that tells how the product was built."""
    return [line.strip() for text in READERS[path.suffix](path.read_text())
            for line in text.splitlines() if HISTORY.search(line)]


FILES = sorted(path for folder in FOLDERS if (ROOT / folder).is_dir()
               for path in (ROOT / folder).rglob("*") if path.suffix in SUFFIXES and path.is_file()
               and path != PATTERN and ".venv" not in path.parts and "__pycache__" not in path.parts)


def test_no_docstring_comment_or_promise_tells_how_the_product_was_built() -> None:
    found = {path.relative_to(ROOT).as_posix(): lines for path in FILES if (lines := told(path))}
    assert found == {}


def test_the_scan_reads_docstrings_comments_and_promises_but_not_the_code_s_strings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Forks (issue 28)."""\nX = "issue 31\'s ninth stop"  # as this stop did\n'
                      'def f() -> None:\n    """Issue 26 #4: a wait."""\n    return None\n')
    assert told(module) == ["# as this stop did", "Forks (issue 28).", "Issue 26 #4: a wait."]
    script = tmp_path / "s.lua"
    script.write_text('local x = "issue 31"  -- (issue 16, #13)\n')
    assert told(script) == ["-- (issue 16, #13)"]
    breaks = tmp_path / "b.toml"
    breaks.write_text('# -- issue 29: the CLI --\n[[break]]\npromise = "an idle worker stops (issue 10)"\n'
                      "new = '''issue 31's ninth stop'''\n")
    assert told(breaks) == ["# -- issue 29: the CLI --", "an idle worker stops (issue 10)"]
