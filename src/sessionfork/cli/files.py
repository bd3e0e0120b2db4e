"""The JSON files of ``sessionfork fork``: ``--edits``, ``--variants`` and ``--summary``, in the wire shapes.

A file that is not UTF-8 JSON of the expected shape is a usage error (exit status 2) naming the option;
the events' own rules (size, JSON values) are the worker's, as for any request.
"""

from __future__ import annotations

from typing import IO, Any

import click
import msgspec

from ..core.errors import ForkError
from ..core.wire import NewEvent, Summary
from ..protocol.requests import Variant

_json = msgspec.json.Decoder(Any)


def load_json(stream: IO[bytes], option: str) -> Any:
    data = stream.read()
    try:
        return _json.decode(data)
    except UnicodeDecodeError as exc:  # msgspec's error for a string that is not UTF-8
        raise click.BadParameter(f"not UTF-8: {exc.reason}", param_hint=option) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from None


def _events(value: Any, option: str) -> list[NewEvent]:
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise click.BadParameter('expected a JSON array of events {"type", "data", ...}', param_hint=option)
    events = []
    for i, body in enumerate(value):
        rest = dict(body)
        kind = rest.pop("type", None)
        if not isinstance(kind, str) or not kind:
            raise click.BadParameter(f"event {i}: expected a non-empty string type", param_hint=option)
        try:
            events.append(NewEvent(kind, rest.pop("data", None), rest))
        except ForkError as exc:
            raise click.BadParameter(f"event {i}: {exc.message}", param_hint=option) from None
    return events


def read_edits(stream: IO[bytes], option: str) -> list[NewEvent]:
    """The events of an ``--edits`` file: ``[{"type", "data", ...extra}]``."""
    return _events(load_json(stream, option), option)


def read_variants(stream: IO[bytes]) -> list[Variant]:
    """The variants of a ``--variants`` file: ``[{"sessionId"?, "edits"?}]``."""
    value = load_json(stream, "--variants")
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise click.BadParameter('expected a JSON array of {"sessionId"?, "edits"?}', param_hint="--variants")
    out = []
    for i, body in enumerate(value):
        unknown = set(body) - {"sessionId", "edits"}
        if unknown:
            raise click.BadParameter(f"variant {i}: unknown field(s) {sorted(unknown)}", param_hint="--variants")
        sid = body.get("sessionId")
        if sid is not None and not isinstance(sid, str):
            raise click.BadParameter(f"variant {i}: sessionId must be a string", param_hint="--variants")
        out.append(Variant(sid, _events(body.get("edits", []), "--variants")))
    return out


def read_summary(stream: IO[bytes]) -> Summary:
    """The summary of a ``--summary`` file: ``{"keepFrom": K, "data": <any JSON>}``."""
    value = load_json(stream, "--summary")
    if not isinstance(value, dict) or set(value) - {"keepFrom", "data"} or "keepFrom" not in value:
        raise click.BadParameter('expected a JSON object {"keepFrom": K, "data": ...}', param_hint="--summary")
    keep_from = value["keepFrom"]
    if isinstance(keep_from, bool) or not isinstance(keep_from, int):
        raise click.BadParameter("keepFrom must be an integer event seq", param_hint="--summary")
    return Summary(keep_from=keep_from, data=value.get("data"))
