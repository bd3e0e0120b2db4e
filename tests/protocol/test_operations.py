"""The table of operations (``protocol.operations``) is what the wire, the enqueue script, the
metrics and the clients' typed ``wait`` know of operations: an operation the wire accepts has an
entry, the identity the enqueue script compares is the entries' fields, every reply type belongs
to one entry, and each client's ``wait`` has one overload per entry."""

from __future__ import annotations

import re
import sys
import typing
from typing import Any

import pytest

from sessionfork.clients.aio import AsyncClient
from sessionfork.clients.client import Client
from sessionfork.core import errors, wire
from sessionfork.ops import metrics
from sessionfork.protocol import enqueue, operations
from sessionfork.protocol.operations import OPERATIONS


def test_every_op_the_wire_accepts_has_an_entry_and_every_entry_is_accepted() -> None:
    for name, op in OPERATIONS.items():
        assert op.name == name
        payload = "{}" if name == "fork" else f'{{"op":"{name}"}}'
        assert wire.request_op(payload) == name
        assert typing.get_args(op.request.__annotations__.get("op", "")) in ((), (name,))
    with pytest.raises(errors.ForkError):
        wire.request_op('{"op":"rename"}')  # no entry: refused at the edge
    assert set(typing.get_args(wire.AnyRequest)) == {op.request for op in OPERATIONS.values()}


def test_the_enqueue_scripts_identity_is_the_tables() -> None:
    """``wire.IDENTITY_FIELDS`` (which the enqueue script lists, pinned by
    ``tests/protocol/test_enqueue_script.py``) is the ordered union of each entry's identity fields:
    an operation added with fields of its own fails here until the script compares them too."""
    union = tuple(dict.fromkeys(field for op in OPERATIONS.values() for field in op.identity))
    assert sorted(union) == sorted(wire.IDENTITY_FIELDS)
    assert [f for f in wire.IDENTITY_FIELDS if f in union] == list(wire.IDENTITY_FIELDS)
    listed = re.search(r"local FIELDS = \{([^}]*)\}", enqueue.SOURCE)
    assert listed is not None and set(re.findall(r"'([^']*)'", listed.group(1))) == set(union)
    assert operations.of("merge").identity[:3] == ("summary", "op", "parent")


def test_every_reply_type_belongs_to_one_entry_and_its_counter_exists() -> None:
    replies = typing.get_args(wire.Outcome)
    assert sorted(k.__name__ for op in OPERATIONS.values() for k in (op.result, op.failure)) == \
        sorted(k.__name__ for k in replies)  # each reply type in exactly one entry
    for op in OPERATIONS.values():
        assert operations.of_reply(op.failed("r", "INTERNAL", "m")) is op
        assert op.metric in {metrics.FORKS, metrics.MERGES}
        assert op.labels("OK")["code"] == "OK"


@pytest.mark.parametrize("client", [Client, AsyncClient], ids=["sync", "asyncio"])
def test_each_clients_typed_wait_has_one_overload_per_entry(client: type) -> None:
    """Both clients' ``wait`` overloads (what mypy reads) are the table's: a request of each
    operation answers that operation's reply types, and a request id alone any outcome."""
    typed: dict[Any, set[Any]] = {}
    for overload in typing.get_overloads(client.wait):
        hints = typing.get_type_hints(overload, vars(sys.modules[overload.__module__]))
        typed[hints["request"]] = set(typing.get_args(hints["return"]))
    assert typed == {**{op.request: {op.result, op.failure} for op in OPERATIONS.values()},
                     str: set(typing.get_args(wire.Outcome))}
