"""The bundle commands: export, import (registered on ``cli``): a subtree moved between stores."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import msgspec

from ..ops import bundles
from .app import Context, clean_errors, cli


class _Bar:
    """A progress bar on stderr, opened at the first page (when the total is known)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=max(total, 1), label=self.label, file=sys.stderr)
            self.bar.__enter__()
        self.bar.update(done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


@contextmanager
def _progress(label: str) -> Iterator[bundles.Progress | None]:
    """A progress callback drawing a bar on stderr when it is a terminal, else ``None``."""
    if not sys.stderr.isatty():
        yield None
        return
    bar = _Bar(label)
    try:
        yield bar
    finally:
        bar.close()


@cli.command("export")
@click.argument("root")
@click.option("--subtree", "mode", flag_value="subtree", default=True,
              help="ROOT and every descendant (the default).")
@click.option("--lineage", "mode", flag_value="lineage",
              help="ROOT's whole lineage: from its oldest ancestor still there, with every descendant.")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The bundle file to write (replaced whole once complete).")
@click.pass_obj
@clean_errors
def export_command(obj: Context, root: str, mode: bundles.Mode, output: Path) -> None:
    """Write ROOT's subtree (or lineage) to one bundle file and print its manifest as JSON (exit 1 when
    ROOT is not found)."""
    registry = obj.registry()
    fd, tmp = tempfile.mkstemp(prefix=".bundle-", dir=output.parent if str(output.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as out:
            with _progress("export") as progress:
                manifest = bundles.export_bundle(registry, root, out, mode=mode, progress=progress)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    summary = {"file": str(output), "root": manifest.root, "sessions": len(manifest.sessions),
               "events": manifest.events, "base": manifest.base}
    click.echo(msgspec.json.encode(summary).decode())


@cli.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--keep-ids/--new-ids", default=True, show_default=True,
              help="Keep each session's id, or give every session a new one (printed as ids).")
@click.option("--under", "parent", metavar="PARENT",
              help="Make the root a child of PARENT, whose first events must be the bundle's base.")
@click.pass_obj
@clean_errors
def import_command(obj: Context, file: Path, keep_ids: bool, parent: str | None) -> None:
    """Import a bundle file into the registry and print what was done as JSON: its digest, each id's
    id here, the counts, the sessions written (0: imported before). Exit 1 for a bundle that is not
    whole (INVALID_BUNDLE) or an id taken (SESSION_ALREADY_EXISTS), nothing written; a killed
    import resumes when run again."""
    registry = obj.registry()
    with _progress("import") as progress:
        done = bundles.import_bundle(registry, file, new_ids=not keep_ids, under=parent, progress=progress)
    click.echo(msgspec.json.encode(done).decode())
