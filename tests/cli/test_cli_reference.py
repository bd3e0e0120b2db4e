"""The command line reference (docs/cli.md) cannot drift from the CLI: its reference
part is generated from the click commands (``sessionfork.cli.reference``) and compared here, and
its output shapes are the shapes the commands print."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from sessionfork.cli import cli, reference
from sessionfork.cli.session_commands import ShownEvent
from sessionfork.core.retention import Ended, Swept
from sessionfork.core.wire import ForkFailure, ForkResult, SessionUsage, SessionView
from sessionfork.ops.diff import Diff
from sessionfork.ops.lineage import Lineage
from sessionfork.ops.stats import Outcome, Stats

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_reference_is_generated_from_the_commands() -> None:
    assert reference.generated(PAGE.read_text()) == reference.render(cli).strip("\n"), \
        "docs/cli.md is stale: run `python -m sessionfork.cli.reference docs/cli.md`"


def test_every_command_and_flag_is_in_the_reference() -> None:
    text = reference.generated(PAGE.read_text())
    assert re.findall(r"^#### `sessionfork ([a-z-]+)`$", text, flags=re.M) == sorted(cli.commands)
    for name, command in cli.commands.items():
        section = text.partition(f"#### `sessionfork {name}`")[2].partition("\n#### ")[0]
        for param in command.params:
            for flag in param.opts if param.param_type_name == "option" else ():
                assert f"`{flag}`" in section, (name, flag)


def test_the_page_shows_no_escaped_pipe() -> None:
    """A ``\\|`` inside a table's code span renders as a literal backslash (it did nine times)."""
    assert "\\|" not in PAGE.read_text()


def test_a_stale_reference_is_seen(tmp_path: Path) -> None:
    page = tmp_path / "cli.md"
    page.write_text(PAGE.read_text().replace("`--wait` `SECONDS`", "`--wait` `FLOAT`"))
    assert reference.generated(page.read_text()) != reference.render(cli).strip("\n")
    assert reference.rewrite(page, cli) and reference.generated(page.read_text()) == reference.render(cli).strip("\n")


def fields(struct: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(struct)}


def shapes() -> list[dict[str, object]]:
    section = PAGE.read_text().partition("## Output shapes")[2].partition("\n## ")[0]
    blocks = re.findall(r"^```json\n(.*?)^```", section, flags=re.S | re.M)
    return [json.loads(line) for block in blocks for line in block.splitlines()]


# The documented shapes, in page order: fork (a result, a failure), fork --wait 0, outcomes,
# session show, session events (two lines), usage --subtree, stats, health, gc (a branch disposed, a
# session deleted), diff, tree. Optional fields may be left out (shard,
# shards, a result's sessions...).
EXPECTED = [(fields(ForkResult) | {"type"}, {"sessions", "failed"}),
            (fields(ForkFailure) | {"type"}, set()),
            ({"requestId", "queued"}, set()),
            (fields(Outcome), {"shard"}),
            (fields(SessionView), set()),
            (fields(ShownEvent), set()),
            (fields(ShownEvent), set()),
            (fields(SessionUsage), set()),
            (fields(Stats), {"shards"}),
            ({"ok", "queue", "shards"}, set()),
            (fields(Ended), set()),
            (fields(Swept), set()),
            (fields(Diff), {"kept"}),
            (fields(Lineage), set())]


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_each_documented_output_shape_has_the_fields_the_command_prints(index: int) -> None:
    documented = shapes()
    assert len(documented) == len(EXPECTED)
    full, optional = EXPECTED[index]
    assert full - optional <= set(documented[index]) <= full, (index, set(documented[index]) ^ full)
