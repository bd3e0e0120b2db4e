"""A fork option is declared once per layer it crosses, and the three declarations agree: the
clients' typed option (``ForkOptions``), the wire's field (``ForkRequest``) and the core's spec
(``ForkSpec``), each of the same name. What passes an option from one to the next is derived
from them (``requests.PASSED_OPTIONS``, ``requests.PASSED_TO_SPEC``): a plain new option needs
no line of its own in ``build`` or ``spec_of``."""

from __future__ import annotations

import msgspec

from sessionfork.core import wire
from sessionfork.core.specs import ForkSpec
from sessionfork.protocol import requests
from sessionfork.protocol.requests import ForkOptions

OPTIONS = set(ForkOptions.__annotations__)
WIRE = {f.name for f in msgspec.structs.fields(wire.ForkRequest)}
SPEC = {f.name for f in msgspec.structs.fields(ForkSpec)}


def test_every_option_is_a_wire_field_and_every_wire_field_an_option() -> None:
    assert OPTIONS <= WIRE
    assert {"source", "traceparent", "op"} == WIRE - OPTIONS  # the positional source, and what the clients set


def test_every_spec_field_is_the_wire_fields_of_its_name() -> None:
    assert {"child_ids"} == SPEC - WIRE  # planned from session_id, session_ids, count or variants
    assert set(requests.PASSED_TO_SPEC) == SPEC & WIRE - {"source", "request_id", "edits"}
    assert set(requests.PASSED_OPTIONS) == OPTIONS - {"request_id", "edits", "variants"}


def test_each_passed_option_reaches_the_wire_and_the_spec() -> None:
    summary = wire.Summary(keep_from=2, data={"s": 1})
    request = requests.build("src", {"session_id": "kid", "reply_to": "chan", "boundary": 3, "if_length": 8,
                                     "summary": summary}, lambda: "req-1")
    assert (request.session_id, request.reply_to, request.boundary, request.if_length, request.summary) == \
        ("kid", "chan", 3, 8, summary)
    spec = requests.spec_of(request, "req-1", ["kid"])
    assert (spec.boundary, spec.if_length, spec.summary, spec.child_ids) == (3, 8, summary, ("kid",))
    bare = requests.spec_of(requests.build("src", {}, lambda: "req-2"), "req-2", ["k"])
    assert (bare.boundary, bare.if_length, bare.summary, bare.traceparent) == (None, None, None, None)
