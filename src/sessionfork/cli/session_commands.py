"""The commands on one session: ``session show``, ``session events``, ``usage`` (on ``cli``)."""

from __future__ import annotations

import bisect

import click
import msgspec

from ..core import wire
from ..core.registry import Registry
from .app import Context, clean_errors, cli

PAGE = 500
"""Events read per round trip by ``session events``: its memory stays bounded whatever the log."""


@cli.group()
def session() -> None:
    """One session: its header, state, lengths and usage (show), its events (events)."""


def view(registry: Registry, session_id: str) -> wire.SessionView:
    """``session show``'s answer: the header, state, lengths, children and usage of a session."""
    header = registry.header(session_id)
    length = registry.length(session_id)
    seed = header.seed_length if isinstance(header.seed_length, int) else 0
    return wire.SessionView(header=header, state=registry.state_of(session_id), length=length, seed_length=seed,
                            own_length=length - seed, last_turn_end=registry.last_turn_end(session_id),
                            children=registry.children(session_id), usage=registry.usage(session_id))


@session.command("show")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (camelCase).")
@click.pass_obj
@clean_errors
def show(obj: Context, session_id: str, as_json: bool) -> None:
    """Show SESSION_ID's header, state, lengths, children and usage (own and subtree)."""
    found = view(obj.registry(), session_id)
    if as_json:
        click.echo(wire.encode(found).decode())
        return
    h, st = found.header, found.state
    lines = [f"session    {h.id}", f"state      {st.state}" + _state_detail(st),
             f"created    {h.created_at}"]
    if isinstance(h.parent_session, str):
        lines.append(f"parent     {h.parent_session}")
    if isinstance(h.cwd, str):
        lines.append(f"cwd        {h.cwd}")
    lines += [f"length     {found.length} ({found.seed_length} inherited, {found.own_length} own)",
              f"last turn  {'none' if found.last_turn_end is None else found.last_turn_end}",
              f"children   {len(found.children)}" + (f": {', '.join(found.children)}" if found.children else ""),
              f"usage      own: {render_usage(found.usage.own)}",
              f"           subtree: {render_usage(found.usage.subtree)}"]
    click.echo("\n".join(lines))


def _state_detail(st: wire.SessionState) -> str:
    if isinstance(st.merged_into, wire.MergedInto):
        return f" (into {st.merged_into.session} at seq {st.merged_into.seq})"
    if isinstance(st.abandoned_by, str):
        return f" (by {st.abandoned_by})"
    return ""


def render_usage(u: wire.Usage) -> str:
    """One line of usage counters."""
    return (f"input {u.input_tokens}, output {u.output_tokens}, cache read {u.cache_read_tokens}, "
            f"cache write {u.cache_write_tokens}, cost {u.cost_micros} micros")


class ShownEvent(msgspec.Struct, frozen=True):
    """One line of ``session events --json``: the session whose log holds the event (an ancestor
    for an inherited seed event, else the session itself) and the event."""

    session: str
    inherited: bool
    event: msgspec.Raw


@session.command("events")
@click.argument("session_id")
@click.option("--from", "first", type=click.IntRange(min=0), default=0, show_default=True,
              help="The first seq to print.")
@click.option("--to", "last", type=click.IntRange(min=0), help="The last seq to print (default: the last event).")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object a line: {"session", "inherited", "event"}.')
@click.pass_obj
@clean_errors
def events(obj: Context, session_id: str, first: int, last: int | None, as_json: bool) -> None:
    """Print SESSION_ID's events FROM..TO, seed included: each inherited event marked with the
    ancestor whose log holds it. Read in pages (bounded memory, whatever the log's length)."""
    registry = obj.registry()
    owners = registry.owners(session_id)
    starts = [a for _, a, _ in owners]
    stop = registry.length(session_id) if last is None else last + 1
    seq = first
    while seq < stop:
        page = registry.events(session_id, seq, min(seq + PAGE, stop))
        for e in page:
            at = bisect.bisect_right(starts, e.seq) - 1
            owner = owners[at][0] if at >= 0 and e.seq < owners[at][2] else session_id
            if as_json:
                click.echo(wire.encode(ShownEvent(owner, owner != session_id,
                                                  msgspec.Raw(wire.encode_event(e)))).decode())
            else:
                mark = f"  [{owner}]" if owner != session_id else ""
                data = wire.encode(e.data).decode()
                click.echo(f"{e.seq:>6}  {e.type}{mark}  {data[:200]}{'…' if len(data) > 200 else ''}")
        if len(page) < min(PAGE, stop - seq):
            break
        seq += len(page)


@cli.command()
@click.argument("session_id")
@click.option("--subtree", is_flag=True, help="The subtree's total too (itself and every descendant).")
@click.option("--json", "as_json", is_flag=True, help='One JSON object: {"id", "own"} (and "subtree").')
@click.pass_obj
@clean_errors
def usage(obj: Context, session_id: str, subtree: bool, as_json: bool) -> None:
    """Print SESSION_ID's own usage (and with --subtree, its subtree's total)."""
    found = obj.registry().usage(session_id)
    if as_json:
        shown = found if subtree else {"id": found.id, "own": found.own}
        click.echo(wire.encode(shown).decode())
        return
    click.echo(f"{found.id}  own: {render_usage(found.own)}")
    if subtree:
        click.echo(f"{found.id}  subtree: {render_usage(found.subtree)}")
