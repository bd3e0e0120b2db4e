"""The merge-side commands: merge, select (registered on ``cli``): a branch's result brought back."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any, TypeVar

import click

from ..clients.client import Client
from ..core import wire
from ..protocol.merge_requests import ClientMergeOptions
from ..protocol.requests import MAX_WAIT
from .app import Context, clean_errors, cli
from .files import load_json
from .queue_commands import check_wait, send

_MODE = click.Choice(["summary", "events"])


def _merge_options(mode: str, summary_file: IO[bytes] | None, span: tuple[int, int] | None,
                   if_parent_length: int | None, if_child_length: int | None, request_id: str | None,
                   reply_to: str | None) -> ClientMergeOptions:
    summary = None if summary_file is None else load_json(summary_file, "--summary")
    if mode == "summary" and summary is None:
        raise click.BadParameter("mode summary needs --summary FILE (any JSON but null)", param_hint="--summary")
    return {"mode": "summary" if mode == "summary" else "events", "summary": summary, "range": span,
            "if_parent_length": if_parent_length, "if_child_length": if_child_length, "request_id": request_id,
            "reply_to": reply_to}


F = TypeVar("F", bound=Callable[..., Any])


def _options(command: F) -> F:
    """The options merge and select share, in the order --help lists them."""
    for option in reversed([
        click.option("--mode", type=_MODE, required=True,
                     help="summary: one session/summary event holding --summary; events: the range's events."),
        click.option("--summary", "summary_file", type=click.File("rb"),
                     help="JSON file (- for stdin): the summary, any JSON (mode summary: required)."),
        click.option("--range", "span", type=(click.IntRange(min=0), click.IntRange(min=0)), metavar="FROM TO",
                     help="The child's events FROM..TO to merge (default: its own events after its seed up to "
                          "its last completed turn)."),
        click.option("--if-parent-length", type=click.IntRange(min=0),
                     help="Only if PARENT's log has exactly this many events (else PRECONDITION_FAILED)."),
        click.option("--if-child-length", type=click.IntRange(min=0),
                     help="Only if the child's log has exactly this many events (else PRECONDITION_FAILED)."),
        click.option("--instance", help="Merge only into this live instance of PARENT (a live handle)."),
        click.option("--request-id", help="Idempotency key (default: generated)."),
        click.option("--reply-to", help="Reply channel for this request."),
        click.option("--wait", "wait_s", type=float, default=10.0, show_default=True, callback=check_wait,
                     metavar="SECONDS",
                     help=f"Seconds to wait for the reply (0-{MAX_WAIT}); 0 = enqueue only and print the request id."),
    ]):
        command = option(command)
    return command


@cli.command()
@click.argument("parent")
@click.argument("child")
@_options
@click.pass_obj
@clean_errors
def merge(obj: Context, parent: str, child: str, mode: str, summary_file: IO[bytes] | None,
          span: tuple[int, int] | None, if_parent_length: int | None, if_child_length: int | None,
          instance: str | None, request_id: str | None, reply_to: str | None, wait_s: float) -> None:
    """Enqueue a merge of CHILD into PARENT (an ancestor of it) and print the reply event as JSON
    (exit 1 on an error code; no reply within --wait: exit 4, `sessionfork wait REQUEST_ID` again)."""
    client = Client(obj.shard_redis(), obj.settings)
    target: str | wire.LiveHandle = wire.LiveHandle(parent, instance) if instance else parent
    options = _merge_options(mode, summary_file, span, if_parent_length, if_child_length, request_id, reply_to)
    send(client, client.merge_request(target, child, **options), wait_s)


@cli.command()
@click.argument("parent")
@click.argument("candidates", nargs=-1, required=True)
@click.argument("winner")
@_options
@click.pass_obj
@clean_errors
def select(obj: Context, parent: str, candidates: tuple[str, ...], winner: str, mode: str,
           summary_file: IO[bytes] | None, span: tuple[int, int] | None, if_parent_length: int | None,
           if_child_length: int | None, instance: str | None, request_id: str | None, reply_to: str | None,
           wait_s: float) -> None:
    """Best of N: enqueue a select of WINNER among CANDIDATES (WINNER among them) under PARENT, in
    the order of the Python clients' `select(parent, candidates, winner)`: the winner merged as
    `merge` merges it, every other candidate abandoned; print the reply event as JSON (exit 1 on an
    error code, 4 when no reply within --wait). The deprecated order PARENT WINNER CANDIDATES... is
    still taken, with a warning on stderr, where it cannot be read in the new one."""
    listed, winner = _in_order(list(candidates), winner)
    client = Client(obj.shard_redis(), obj.settings)
    target: str | wire.LiveHandle = wire.LiveHandle(parent, instance) if instance else parent
    options = _merge_options(mode, summary_file, span, if_parent_length, if_child_length, request_id, reply_to)
    send(client, client.select_request(target, listed, winner, **options), wait_s)


def _in_order(candidates: list[str], winner: str) -> tuple[list[str], str]:
    """The candidates and the winner of ``select``'s arguments. Read as PARENT CANDIDATES... WINNER
    they must be distinct ids with the winner among them; where they are not, and the deprecated
    order PARENT WINNER CANDIDATES... is (its winner first, among the distinct others), that order
    is taken and stderr says so. Both readings valid only when the first and last ids are the same
    winner: then they name the same select."""
    given = [*candidates, winner]
    if len(set(candidates)) == len(candidates) and winner in candidates:
        return candidates, winner
    first, rest = given[0], given[1:]
    if len(set(rest)) == len(rest) and first in rest:
        click.echo("warning: `sessionfork select PARENT WINNER CANDIDATES...` is deprecated: give "
                   f"`sessionfork select PARENT CANDIDATES... WINNER` ({' '.join(rest)} {first})", err=True)
        return rest, first
    return candidates, winner  # neither reading valid: the select's own checks name the error
