"""``tests/mutations.toml``, the deliberate breaks that ``python3 run.py mutations`` runs: checked on
every CI run (cheap), so that a break whose old text the code no longer has is noticed at once."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def run_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sessionfork_run", ROOT / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass of run.py looks its module up by name
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
tests = ["tests/project/test_mutations_file.py"]
''')
    try:
        run.load_mutations(broken)
    except ValueError as exc:
        assert "twice: old text found" in str(exc)
    else:
        raise AssertionError("a break with an ambiguous old text was accepted")


VERDICT_CASES = '''
import pytest

@pytest.fixture
def broken_fixture():
    raise RuntimeError("set-up failed")

def test_errors_in_setup(broken_fixture):
    pass

def test_raises_something_else():
    raise KeyError("not an assertion")

@pytest.mark.timeout(0.2)
def test_runs_out_of_time():
    while True:
        pass

def test_passes():
    assert True

def test_fails_an_assert():
    assert 1 == 2, "the promise broke"

def test_never_reached():
    assert False
'''


def test_the_verdict_plugin_tells_an_assertion_from_errors_and_time_outs_and_stops_at_the_first_assertion(
        tmp_path: Path) -> None:
    run = run_module()
    (tmp_path / "test_cases.py").write_text(VERDICT_CASES)
    report = tmp_path / "verdicts.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), run.REPORT_ENV: str(report)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", run.VERDICT_PLUGIN,
                           "-p", "no:randomly", "test_cases.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(r["nodeid"].split("::")[1], r["when"], r["assertion"]) for r in rows] == [
        ("test_errors_in_setup", "setup", False),
        ("test_raises_something_else", "call", False),
        ("test_runs_out_of_time", "call", False),
        ("test_fails_an_assert", "call", True),
    ], done.stdout
    assert "the promise broke" in rows[-1]["text"]
    assert "test_never_reached" not in done.stdout and "stopped at the first failed assertion" in done.stdout
    assert run.verdict(run.BreakRun(done.returncode, rows, 1.0, "")) == "caught"
    assert run.verdict(run.BreakRun(done.returncode, rows, 1.0, ""), expect="promise bro") == "caught"
    assert run.verdict(run.BreakRun(done.returncode, rows, 1.0, ""), expect="another promise").startswith(
        "not caught")


def test_only_a_failed_assertion_catches_a_break() -> None:
    run = run_module()
    error = {"nodeid": "t::a", "when": "call", "assertion": False, "text": "redis.exceptions.NoScriptError"}
    setup = {"nodeid": "t::b", "when": "setup", "assertion": False, "text": "chromium not found"}
    timeout = {"nodeid": "t::c", "when": "call", "assertion": False, "text": "Failed: Timeout (>300.0s)"}
    assert run.verdict(run.BreakRun(0, [], 1.0, "")) == "missed"
    assert run.verdict(run.BreakRun(1, [error], 1.0, "")) == "not caught (no failed assertion: error)"
    assert run.verdict(run.BreakRun(1, [setup, timeout], 1.0, "")) == "not caught (no failed assertion: error, setup)"
    assert run.verdict(run.BreakRun(2, [], 1.0, "")) == "not caught (no failed assertion: exit 2)"
    assert run.verdict(run.BreakRun(None, [], 1.0, "")) == "hung"
    assert run.verdict(run.BreakRun(2, [], 0.0, "Lua", refused=True)) == "refused"


def test_a_break_whose_lua_does_not_load_is_refused_before_any_test_runs() -> None:
    run = run_module()
    lua = "src/sessionfork/core/scripts/settle.lua"
    old = "redis.call('HSET', KEYS[1], 'seed', ARGV[1])"
    assert (ROOT / lua).read_text().count(old) == 1
    broken = {"id": "x", "promise": "x", "file": lua, "old": old, "new": old[:-1], "tests": ["tests/core/test_keys.py"]}
    result = run._in_copy(sys.executable, broken, ["tests/core/test_keys.py"])
    assert run.verdict(result) == "refused" and "does not load" in result.tail and "expected" in result.tail, result
