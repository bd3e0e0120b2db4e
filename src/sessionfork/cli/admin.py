"""The operators' commands: tree, diff, repair, delete, gc, outcomes (and its deprecated name events),
stats, persist, acl, load-functions (on ``cli``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ..core import wire
from ..core.registry import DELETED
from .app import LOG_LEVELS, Context, clean_errors, cli, env_help


@cli.command()
@click.argument("session_id")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "mermaid", "html"]), default="text",
              show_default=True, help="html: one self-contained page (no script, nothing fetched).")
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@click.pass_obj
@clean_errors
def tree(obj: Context, session_id: str, fmt: str, as_json: bool) -> None:
    """Show SESSION_ID's ancestors and all its descendants."""
    from ..ops import lineage

    fmt = "json" if as_json else fmt
    found = lineage.lineage(obj.registry(), session_id)
    if fmt == "html":
        from ..ops.lineage_html import render_html

        click.echo(render_html(found), nl=False)
    elif fmt == "json":
        click.echo(wire.encode(found).decode())
    elif fmt == "mermaid":
        click.echo(lineage.render_mermaid(found))
    else:
        click.echo(lineage.render_text(found))


@cli.command()
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="The diff as one JSON object.")
@click.pass_obj
@clean_errors
def diff(obj: Context, a: str, b: str, as_json: bool) -> None:
    """Compare two sessions: common ancestor, fork points, each side's events after the shared prefix."""
    from ..ops import diff as branch_diff

    found = branch_diff.diff(obj.registry(), a, b)
    if found.ancestor is None:
        click.echo(f"error: sessions {a!r} and {b!r} are unrelated: they have no common ancestor", err=True)
        sys.exit(1)
    click.echo(wire.encode(found).decode() if as_json else branch_diff.render_text(found))


@cli.command()
@click.argument("session_id")
@click.pass_obj
@clean_errors
def repair(obj: Context, session_id: str) -> None:
    """Close the turn a crashed host left open, so the session forks again."""
    from ..ops.repair import repair as close_open_turn

    added = close_open_turn(obj.registry(), session_id)
    if not added:
        click.echo(f"{session_id}: balanced, nothing to repair")
        return
    click.echo(f"{session_id}: appended {len(added)} event(s), seq {added[0].seq}..{added[-1].seq}: "
               + ", ".join(e.type for e in added))


MAX_TIMEOUT = 86400


def _check_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0 <= value <= MAX_TIMEOUT:  # NaN fails too (a NaN deadline is never reached)
        raise click.BadParameter(f"expected 0 to {MAX_TIMEOUT} seconds, got {value}", ctx, param)
    return value


@cli.command()
@click.argument("session_ids", nargs=-1, required=True)
@click.option("--timeout", type=float, default=30.0, show_default=True, callback=_check_timeout,
              help=f"With SESSIONFORK_DELETE_AFTER_PERSIST: seconds (0-{MAX_TIMEOUT}) to wait for the "
                   "persistence backend.")
@click.pass_obj
@clean_errors
def delete(obj: Context, session_ids: tuple[str, ...], timeout: float) -> None:
    """Delete sessions: their ids answer SESSION_NOT_FOUND from now on and are never reused.

    Descendants keep every event (a log they read is kept until the last of them is deleted).
    """
    registry = obj.registry()
    wait = obj.settings.delete_after_persist
    for sid in session_ids:
        deadline = time.monotonic() + timeout
        while registry.delete(sid, persisted_first=wait) != DELETED:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{sid}: the persistence backend did not write its whole log within {timeout}s")
            time.sleep(0.2)  # polling the backend's progress, which a flush was just asked for
        click.echo(f"{sid}: deleted")


@cli.command()
@click.option("--dry-run", is_flag=True, help="List what would go and the bytes it would free; change nothing.")
@click.option("--older-than", type=int, help=env_help("Seconds since disposal (default: the retention).", "retention"))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session.")
@click.pass_obj
@clean_errors
def gc(obj: Context, dry_run: bool, older_than: int | None, as_json: bool) -> None:
    """Dispose branches that ended longer ago than the branch TTL, then delete disposed sessions
    older than the retention (never a live one)."""
    from ..core.factories import now_ms
    from ..core.retention import dispose_ended, sweep

    seconds = older_than if older_than is not None else obj.settings.retention
    ttl = obj.settings.branch_ttl
    if seconds <= 0 and ttl <= 0:
        raise click.UsageError("retention is off and SESSIONFORK_BRANCH_TTL is 0: set SESSIONFORK_RETENTION or "
                               "pass --older-than SECONDS")
    registry = obj.registry()
    held = ended = 0
    while ttl > 0:
        branches = dispose_ended(registry, now_ms=now_ms(), older_than_ms=ttl * 1000, dry_run=dry_run,
                                 limit=100_000 if dry_run else 1000)
        for b in branches:
            when = datetime.fromtimestamp(b.ended_at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
            click.echo(wire.encode(b).decode() if as_json else
                       f"{b.id}  {b.state} {when}Z  {b.bytes} B  ({'would be ' if dry_run else ''}disposed: "
                       "branch TTL)")
        held += sum(b.bytes for b in branches)
        ended += len(branches)
        if dry_run or not branches:
            break
    if ttl > 0:
        click.echo(f"{ended} ended branch(es) {'would be ' if dry_run else ''}disposed, holding {held} bytes "
                   "(freed by retention once it has passed)", err=as_json)
    if seconds <= 0:
        return
    total = count = 0
    while True:
        batch = sweep(registry, now_ms=now_ms(), older_than_ms=seconds * 1000, dry_run=dry_run,
                      limit=100_000 if dry_run else 1000, persisted_first=obj.settings.delete_after_persist)
        for s in batch:
            when = datetime.fromtimestamp(s.disposed_at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
            click.echo(wire.encode(s).decode() if as_json else
                       f"{s.id}  disposed {when}Z  {s.bytes} B" + ("  (log kept: descendants)" if s.log_kept else ""))
        total += sum(s.bytes for s in batch)
        count += len(batch)
        if dry_run or not batch:
            break
    verb = "would free" if dry_run else "freed"
    click.echo(f"{count} session(s) {'would be ' if dry_run else ''}deleted, {verb} {total} bytes", err=as_json)


def _outcome_options(command: Any) -> Any:
    for option in reversed([
        click.option("--follow", "-f", is_flag=True, help="Keep printing new outcomes as they come."),
        click.option("--new", "only_new", is_flag=True, help="Skip the outcomes already in the stream."),
        click.option("--json", "as_json", is_flag=True, help="One JSON object per line."),
    ]):
        command = option(command)
    return command


@cli.command()
@_outcome_options
@click.pass_obj
@clean_errors
def outcomes(obj: Context, follow: bool, only_new: bool, as_json: bool) -> None:
    """Print the outcome stream, one line per outcome (code coloured on a terminal)."""
    _print_outcomes(obj, follow, only_new, as_json)


@cli.command("events")
@_outcome_options
@click.pass_obj
@clean_errors
def events_alias(obj: Context, follow: bool, only_new: bool, as_json: bool) -> None:
    """Deprecated: the old name of `outcomes` (a session's own events: `session events ID`)."""
    click.echo("warning: `sessionfork events` is deprecated: use `sessionfork outcomes` (a session's own "
               "events: `sessionfork session events ID`)", err=True)
    _print_outcomes(obj, follow, only_new, as_json)


def _print_outcomes(obj: Context, follow: bool, only_new: bool, as_json: bool) -> None:
    from ..ops.stats import format_line, read_sharded

    style = click.style if sys.stdout.isatty() and not as_json else None
    with contextlib.suppress(KeyboardInterrupt):
        for outcome in read_sharded(obj.shard_redis(), start="$" if only_new else "-", follow=follow or only_new):
            click.echo(wire.encode(outcome).decode() if as_json else format_line(outcome, style))


@cli.command()
@click.option("--window", type=click.IntRange(1, 3650 * 86400), default=3600, show_default=True,
              help="Seconds to look back (at most ten years).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (camelCase).")
@click.pass_obj
@clean_errors
def stats(obj: Context, window: int, as_json: bool) -> None:
    """Counts per outcome code and run-time percentiles over a window."""
    from ..core.factories import now_ms
    from ..ops.stats import compute_stats, render_stats

    result = compute_stats(obj.shard_redis(), window, now_ms())
    click.echo(wire.encode(result).decode() if as_json else render_stats(result))


@cli.command()
@click.option("--root", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory of the JSONL files.")
@click.option("--consumer", help="Consumer name in the group (default: host name and pid).")
@click.option("--group", default="persist", show_default=True, help="Consumer group on sf:lifecycle.")
@click.option("--sync", "sync_ids", multiple=True, help="Bring these sessions' files up to date, then exit.")
@click.option("--log-level", type=LOG_LEVELS, default="INFO", show_default=True)
@click.pass_obj
@clean_errors
def persist(obj: Context, root: Path, consumer: str | None, group: str, sync_ids: tuple[str, ...],
            log_level: str) -> None:
    """Write sessions as the original harness's JSONL files, from the lifecycle stream (SIGTERM stops)."""
    from ..ops.metrics import configure_logging
    from ..ops.persist import JsonlBackend

    configure_logging("text", log_level.upper())
    root.mkdir(parents=True, exist_ok=True)  # an unusable root is one clear error now, not later
    name = consumer or f"{socket.gethostname()}-{os.getpid()}"
    backend = JsonlBackend(obj.registry(), root, group=group, consumer=name)
    if sync_ids:
        for sid in sync_ids:
            click.echo(f"{sid}: {backend.sync(sid)} event(s) written")
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    handled = backend.run(stop)
    click.echo(f"persist stopped after {handled} lifecycle entries", err=True)


@cli.command()
@click.option("--password", "passwords", multiple=True, metavar="USER=PASSWORD",
              help="A user's password (repeatable); users without one get a generated password.")
@click.pass_obj
@clean_errors
def acl(obj: Context, passwords: tuple[str, ...]) -> None:
    """Print Redis ACL SETUSER commands for the roles (scheduler, worker, host, persist, console)."""
    from ..ops import acl as rules

    given = dict(p.split("=", 1) for p in passwords if "=" in p)
    unknown = set(given) - set(rules.USERS)
    if unknown or len(given) != len(passwords) or not all(given.values()):
        raise click.UsageError(f"--password takes USER=PASSWORD (a non-empty password) with USER among "
                               f"{', '.join(rules.USERS)}")
    for user in rules.USERS:
        if user not in given:
            given[user] = secrets.token_urlsafe(24)
            click.echo(f"# generated password for {user}: {given[user]}", err=True)
    click.echo(rules.render(rules.acl_rules(obj.settings, given)), nl=False)


@cli.command("load-functions")
@click.pass_obj
@clean_errors
def load_functions(obj: Context) -> None:
    """Load (or replace) the enqueue library on the queue server (FUNCTION LOAD REPLACE): then
    schedulers enqueue with FCALL sf_enqueue, the one thing the sf-scheduler ACL role may run.
    Run it as an admin user after each upgrade (and after the server lost its data)."""
    from ..protocol.enqueue import FUNCTION, load_library

    name = load_library(obj.queue_redis())
    click.echo(f"loaded library {name} (function {FUNCTION}) on the queue server")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--bound", type=click.FloatRange(0.5, 60), default=2.0, show_default=True, metavar="SECONDS",
              help="Each page's Redis reads answer within this time (an unreachable server: an error banner).")
@click.pass_obj
@clean_errors
def console(obj: Context, host: str, port: int, bound: float) -> None:
    """Serve the operators' web console (needs the [console] extra): live outcomes, search by
    request or session id, workers and queue depth per shard, pause and resume of a shard's queue.
    Read-only unless SESSIONFORK_CONSOLE_TOKEN is set: then pause and resume need that token."""
    try:
        import uvicorn

        from ..console import Console, create_app
    except ImportError as exc:
        raise click.UsageError(f"the console needs the [console] extra ({exc}): sessionfork is not on PyPI, so "
                               "install the extra from your checkout or wheel: "
                               "pip install '/path/to/sessionfork[console]' or "
                               "pip install '/path/to/sessionfork-<version>-py3-none-any.whl[console]'") from None
    obj.bound_by(bound)
    app = create_app(Console(shards=obj.shard_redis(), registry=obj.registry(), settings=obj.settings,
                             token=obj.console_token, bound=bound))
    click.echo(f"console on http://{host}:{port}/ ({'actions need the token' if obj.console_token else 'read-only'})",
               err=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        # uvicorn stops on them (its own handlers), then raises them again with the handlers it
        # found: these, so that a stop is exit status 0, as the worker's and persist's are.
        signal.signal(sig, lambda *_: None)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
