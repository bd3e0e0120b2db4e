"""``tests/mutations.toml``, the deliberate breaks that ``python3 run.py mutations`` runs: checked on
every CI run (cheap), so that a break whose old text the code no longer has is noticed at once."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def run_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sessionfork_run", ROOT / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_break_parses_and_its_old_text_occurs_exactly_once() -> None:
    breaks = run_module().load_mutations()  # raises, naming each problem
    assert len(breaks) >= 20
    for b in breaks:
        assert b["old"] and b["tests"] and "\n" not in b["promise"], b["id"]


def test_a_break_whose_old_text_is_not_found_exactly_once_is_refused(tmp_path: Path) -> None:
    run = run_module()
    text = (ROOT / "tests" / "mutations.toml").read_text()
    broken = tmp_path / "mutations.toml"
    assert tomllib.loads(text)["break"]
    broken.write_text(text + '''
[[break]]
id = "twice"
promise = "x"
file = "run.py"
old = "import"
new = "export"
tests = ["tests/unit/test_mutations_file.py"]
''')
    try:
        run.load_mutations(broken)
    except ValueError as exc:
        assert "twice: old text found" in str(exc)
    else:
        raise AssertionError("a break with an ambiguous old text was accepted")
