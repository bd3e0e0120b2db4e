"""The request fields ``ifLength``, ``edits`` and ``variants`` on the wire: their types, the
clients' request builder, and their place in a request's identity (old digests unchanged)."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from sessionfork.core import wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.wire import LiveHandle, NewEvent
from sessionfork.protocol import requests
from sessionfork.protocol.requests import Limits, Variant

LIMITS = Limits(max_request_bytes=65536, max_fanout=16)


def parse(body: bytes) -> wire.ForkRequest:
    return requests.parse(body, "r1", LIMITS)


def old_digest(request: wire.ForkRequest) -> str:
    """The digest as computed before these fields existed (stored request records carry it)."""
    fields = [request.source, request.session_id, request.count, request.session_ids]
    if request.boundary is not msgspec.UNSET:
        fields.append(request.boundary)
    return hashlib.sha256(msgspec.json.encode([None if f is msgspec.UNSET else f for f in fields])).hexdigest()


@pytest.mark.parametrize("request_", [
    wire.ForkRequest(source="a"),
    wire.ForkRequest(source=LiveHandle("a", "tok"), session_id="c", request_id="r"),
    wire.ForkRequest(source="a", session_ids=["x", "y"], reply_to="ch"),
    wire.ForkRequest(source="a", count=3, boundary=7),
    wire.ForkRequest(source="a", boundary=0, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
])
def test_a_request_without_the_new_fields_keeps_its_digest(request_: wire.ForkRequest) -> None:
    assert wire.digest(request_) == old_digest(request_)


def test_each_new_field_is_part_of_the_digest() -> None:
    base = wire.ForkRequest(source="a", session_id="c")
    edit = [{"type": "user/message", "data": {"text": "x"}}]
    variants = [
        base, msgspec.structs.replace(base, if_length=0), msgspec.structs.replace(base, if_length=1),
        msgspec.structs.replace(base, edits=edit), msgspec.structs.replace(base, edits=edit * 2),
        msgspec.structs.replace(base, edits=[{"type": "user/message", "data": {"text": "y"}}]),
        wire.ForkRequest(source="a", variants=[wire.Variant(session_id="c")]),
        wire.ForkRequest(source="a", variants=[wire.Variant(session_id="c", edits=edit)]),
        msgspec.structs.replace(base, boundary=3, edits=edit),
    ]
    assert len({wire.digest(r) for r in variants}) == len(variants)


def test_the_key_order_of_an_edit_does_not_change_the_digest() -> None:
    one = parse(b'{"source": "a", "edits": [{"type": "x", "data": {"b": 1, "a": 2}, "z": 1}]}')
    two = parse(b'{"edits": [{"z": 1, "data": {"a": 2, "b": 1}, "type": "x"}], "source": "a"}')
    assert wire.digest(one) == wire.digest(two)


def test_the_builder_writes_the_wire_shapes() -> None:
    request = requests.build("a", {"request_id": "r1", "if_length": 3, "edits": [NewEvent("x", 1, {"k": True})]}, str)
    assert msgspec.to_builtins(request) == {"source": "a", "requestId": "r1", "ifLength": 3,
                                            "edits": [{"type": "x", "data": 1, "k": True}]}
    assert requests.edits_of(parse(wire.encode(request)))[0] == [NewEvent("x", 1, {"k": True})]
    fan = requests.build("a", {"request_id": "r", "variants": [Variant("v", [NewEvent("y")]), Variant()]}, str)
    assert msgspec.to_builtins(fan)["variants"] == [{"sessionId": "v", "edits": [{"type": "y", "data": None}]}, {}]
    assert requests.build("a", {"request_id": "r", "edits": []}, str).edits is msgspec.UNSET


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"edits": [{"type": "x"}]}, "NewEvent objects"),
    ({"edits": "turn/start"}, "sequence of NewEvent"),
    ({"variants": [{"sessionId": "x"}]}, "sessionfork.client.Variant"),
])
def test_the_builder_refuses_what_is_not_an_event(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ForkError) as info:
        requests.build("a", {"request_id": "r", **kwargs}, str)  # type: ignore[typeddict-item]
    assert info.value.code is ErrorCode.INVALID_REQUEST and words in info.value.message


@pytest.mark.parametrize("body", [
    b'{"source": "a", "ifLength": 1.0}', b'{"source": "a", "ifLength": "1"}', b'{"source": "a", "edits": {}}',
    b'{"source": "a", "edits": [1]}', b'{"source": "a", "variants": [[]]}',
    b'{"source": "a", "edits": [{"type": "x", "time": 1}]}',
    b'{"source": "a", "variants": [{}], "sessionIds": ["b"]}',
])
def test_wrong_shapes_are_invalid_request(body: bytes) -> None:
    with pytest.raises(ForkError) as info:
        parse(body)
    assert info.value.code is ErrorCode.INVALID_REQUEST


def test_variants_are_limited_by_the_fan_out_limit() -> None:
    body = b'{"source": "a", "variants": [' + b",".join([b"{}"] * 17) + b"]}"
    with pytest.raises(ForkError, match="expected 1 to 16 variants, got 17"):
        parse(body)
    assert len(parse(body.replace(b"{},", b"", 1)).variants or []) == 16
