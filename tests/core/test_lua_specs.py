"""The tables of Lua scripts (the core's ``lua.SCRIPTS``, the worker's ``outcomes.SCRIPTS``, the
enqueue ``SPEC``), each script called by name with named KEYS and ARGV."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
from script_tables import ALL

from sessionfork.core import lua
from sessionfork.worker.rq_seam import ledger
from sessionfork.worker.rq_seam import worker as seam_worker

SRC = Path(__file__).parents[2] / "src" / "sessionfork"


def test_every_script_file_is_in_a_table_of_its_own_package() -> None:
    files = {(pkg, p.name[:-4]) for pkg in ("sessionfork.core", "sessionfork.protocol", "sessionfork.worker",
                                                "sessionfork.ops", "sessionfork.integrations")
             for p in resources.files(pkg).joinpath("scripts").iterdir() if p.name.endswith(".lua")}
    table = {(spec.package or "sessionfork.core", name) for name, spec in ALL.items()}
    assert table == files


def test_no_call_site_registers_or_evaluates_a_script_itself() -> None:
    allowed = {SRC / "core" / "lua.py", SRC / "worker" / "rq_seam" / "worker.py"}  # RQ's own requeue
    offenders = [f"{path}:{n}" for path in SRC.rglob("*.py") if path not in allowed
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if re.search(r"register_script|lua\.register\(|\.evalsha\(|\.eval\(", line)]
    assert offenders == []


@pytest.mark.parametrize("name", sorted(ALL))
def test_each_spec_names_as_many_keys_as_its_script_reads(name: str) -> None:
    spec = ALL[name]
    text = lua.source(f"{name}.lua", spec.package)
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", text)}
    if spec.keys[-1].endswith("*"):  # then any number of keys: the script reads them by their count
        assert "#KEYS" in text and max(used, default=0) == len(spec.keys) - 1, name
        return
    assert max(used) == len(spec.keys), name


EVERY = {**ALL, **ledger.SCRIPTS, **seam_worker.SCRIPTS}  # with RQ's seam's own scripts


@pytest.mark.parametrize("name", sorted(EVERY))
def test_a_scripts_compact_text_drops_only_its_comment_lines(name: str) -> None:
    """``lua.compact`` (the text registered and sent with each ``EVAL``) drops whole-line comments:
    safe only while no script holds a long bracket (a block comment or a multi-line string)."""
    text = lua.source(f"{name}.lua", EVERY[name].package)
    assert "[[" not in text and "[=" not in text, name
    code = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("--")]
    assert lua.compact(text).splitlines() == code
    assert len(lua.compact(text)) < len(text)  # every script documents itself in comments


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


def test_build_each_builds_what_build_builds_for_each_item() -> None:
    """A fan-out's calls built as one (the names checked and the shared values placed once) are the
    calls built one by one: the items' values in their places, a varying sequence last, an item
    with a left-out name or other names built on its own."""
    spec = lua.Spec("t", ("a", "b?", "c?"), ("x", "y", "rest*"))
    shared = {"b": "B", "x": 1}
    each = [{"a": "A1", "y": "y1", "rest": [2, 3]}, {"a": "A2", "y": "y2", "rest": ()},
            {"a": "A3", "y": None, "rest": [4]}, {"a": "A4", "y": "y4", "c": "C4", "rest": [5]}]
    with pytest.raises(TypeError, match="needs y"):
        spec.build({**shared, **each[2]})
    good = [each[0], each[1], each[3]]
    assert spec.build_each(shared, good) == [spec.build({**shared, **item}) for item in good]
    assert spec.build_each(shared, good)[0] == (["A1", "B"], [1, "y1", 2, 3])
    assert spec.build_each(shared, good)[2] == (["A4", "B", "C4"], [1, "y4", 5])
    assert spec.build_each({**shared, "rest": [9]}, [{"a": "A", "y": "y"}] * 2) == [(["A", "B"], [1, "y", 9])] * 2
    assert spec.build_each(shared, []) == []
    with pytest.raises(TypeError, match="needs y"):
        spec.build_each(shared, [each[0], each[2]])
    with pytest.raises(TypeError, match="takes no z"):
        spec.build_each(shared, [{**each[0], "z": 0}])


def test_create_many_takes_creates_arguments_in_creates_order() -> None:
    """``create_many.lua`` rebuilds ``create.lua``'s ARGV for each child by position: its shared
    arguments are ``create``'s without the instance, the session id and the edits, in the same
    order; its shared keys are ``create``'s optional parent-side keys."""
    create, many = lua.SCRIPTS["create"], lua.SCRIPTS["create_many"]
    assert many.args == (*(a for a in create.args if a not in ("instance", "session_id", "edits*")), "each*")
    assert create.args.index("instance") == 1 and create.args.index("session_id") == 8  # a[2], a[9] in Lua
    assert many.keys == ("lifecycle", "parent_children", "parent", "children*")
    assert create.keys[3:6] == ("lifecycle?", "parent_children?", "parent?")
