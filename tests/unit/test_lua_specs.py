"""One table of Lua scripts (``core.lua.SCRIPTS``), each called by name with named KEYS and ARGV."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from sessionfork.core import lua

SRC = Path(__file__).parents[2] / "src" / "sessionfork"


def test_every_script_file_is_in_the_one_table() -> None:
    files = {(pkg, p.name[:-4]) for pkg in ("sessionfork.core", "sessionfork.queue")
             for p in resources.files(pkg).joinpath("scripts").iterdir() if p.name.endswith(".lua")}
    table = {(spec.package or "sessionfork.core", name) for name, spec in lua.SCRIPTS.items()}
    assert table == files


def test_no_call_site_registers_or_evaluates_a_script_itself() -> None:
    allowed = {SRC / "core" / "lua.py", SRC / "queue" / "rq_seam" / "maintenance.py"}  # RQ's own requeue
    offenders = [f"{path}:{n}" for path in SRC.rglob("*.py") if path not in allowed
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"register_script|lua\.register\(|\.evalsha\(|\.eval\(", line)]
    assert offenders == []


@pytest.mark.parametrize("name", sorted(lua.SCRIPTS))
def test_each_spec_names_as_many_keys_as_its_script_reads(name: str) -> None:
    spec = lua.SCRIPTS[name]
    text = lua.source(f"{name}.lua", spec.package)
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", text)}
    assert max(used) == len(spec.keys), name


def test_build_takes_names_in_order_and_leaves_out_trailing_optional_ones() -> None:
    spec = lua.Spec("t", ("a", "b?", "c?"), ("x", "rest*"))
    assert spec.build({"a": "A", "b": "B", "x": 1, "rest": [2, 3]}) == (["A", "B"], [1, 2, 3])
    assert spec.build({"a": "A", "x": 1}) == (["A"], [1])


@pytest.mark.parametrize(("named", "message"), [
    ({"x": 1}, "needs a"), ({"a": "A", "x": 1, "y": 2}, "takes no y"),
    ({"a": "A", "c": "C", "x": 1}, "c given after b was left out"),
])
def test_build_refuses_a_missing_unknown_or_misplaced_name(named: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        lua.Spec("t", ("a", "b?", "c?"), ("x", "rest*")).build(named)
