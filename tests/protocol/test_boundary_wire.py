"""The request field ``boundary`` on the wire: its type, its place in the request's identity."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from sessionfork.core import wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.wire import LiveHandle
from sessionfork.protocol import requests
from sessionfork.protocol.requests import Limits

LIMITS = Limits(max_request_bytes=65536, max_fanout=16)


def parse(body: bytes) -> wire.ForkRequest:
    return requests.parse(body, "r1", LIMITS)


def test_an_integer_boundary_is_accepted_and_encoded_last() -> None:
    request = parse(b'{"source": "a", "boundary": 7}')
    assert request.boundary == 7
    assert wire.encode(request) == b'{"source":"a","boundary":7}'


def test_a_negative_boundary_parses_and_is_left_to_the_boundary_rule() -> None:
    assert parse(b'{"source": "a", "boundary": -1}').boundary == -1


@pytest.mark.parametrize("value", [b"true", b"false", b"1.0", b'"7"', b'"lastTurn"', b"null", b"[1]", b"{}"])
def test_any_other_type_is_invalid_request_naming_the_field(value: bytes) -> None:
    with pytest.raises(ForkError) as info:
        parse(b'{"source": "a", "boundary": ' + value + b"}")
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert "boundary" in info.value.message


def old_digest(request: wire.ForkRequest) -> str:
    """The digest as computed before boundaries existed (stored request records carry it)."""
    fields = (request.source, request.session_id, request.count, request.session_ids)
    key = [None if f is msgspec.UNSET else f for f in fields]
    return hashlib.sha256(msgspec.json.encode(key)).hexdigest()


@pytest.mark.parametrize("request_", [
    wire.ForkRequest(source="a"),
    wire.ForkRequest(source=LiveHandle("a", "tok"), session_id="c", request_id="r"),
    wire.ForkRequest(source="a", session_ids=["x", "y"], reply_to="ch"),
    wire.ForkRequest(source="a", count=3),
])
def test_a_request_without_boundary_keeps_its_digest(request_: wire.ForkRequest) -> None:
    assert wire.digest(request_) == old_digest(request_)


def test_the_boundary_is_part_of_the_digest() -> None:
    digests = {wire.digest(wire.ForkRequest(source="a", session_id="c", boundary=b)) for b in (0, 1, 7)}
    digests.add(wire.digest(wire.ForkRequest(source="a", session_id="c")))
    assert len(digests) == 4
