"""The ``summary`` field on the wire: its shape, its place in the request identity, and the
header's ``keptFrom`` (added last with a default: older readers keep working)."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

import sessionfork
from sessionfork.core import errors, wire
from sessionfork.protocol import requests
from sessionfork.protocol.requests import Limits

LIMITS = Limits(max_request_bytes=65536, max_fanout=16)
EDIT = [{"type": "user/message", "data": {"text": "x"}}]


def test_summary_is_part_of_the_identity() -> None:
    base = wire.ForkRequest(source="a", session_id="c")
    with_summary = [msgspec.structs.replace(base, summary=wire.Summary(keep_from=k, data=d))
                    for k, d in ((1, None), (2, None), (1, "s"), (1, {"b": 1, "a": 2}))]
    assert len({wire.digest(r) for r in [base, *with_summary]}) == 5
    # key order inside the summary's data does not matter
    again = requests.parse(b'{"source": "a", "sessionId": "c", "summary": {"data": {"a": 2, "b": 1}, "keepFrom": 1}}',
                           "r1", LIMITS)
    assert wire.digest(again) == wire.digest(with_summary[3])


def test_requests_without_a_summary_keep_the_digest_they_had_before_it() -> None:
    request = wire.ForkRequest(source="a", if_length=2, edits=EDIT)
    before = msgspec.json.Encoder(order="deterministic").encode(["a", None, None, None, None, 2, EDIT])
    assert wire.digest(request) == hashlib.sha256(before).hexdigest()
    assert wire.identity(wire.ForkRequest(source="a", summary=wire.Summary(keep_from=3))) == \
        b'["a",null,null,null,null,null,null,null,{"keepFrom":3,"data":null}]'


@pytest.mark.parametrize("body", [
    b'{"source": "a", "summary": {"keepFrom": true, "data": 1}}',
    b'{"source": "a", "summary": {"keepFrom": "3"}}',
    b'{"source": "a", "summary": {"data": 1}}',
    b'{"source": "a", "summary": {"keepFrom": 3, "extra": 1}}',
    b'{"source": "a", "summary": [3]}',
])
def test_a_malformed_summary_is_invalid_request(body: bytes) -> None:
    with pytest.raises(errors.ForkError) as info:
        requests.parse(body, "r1", LIMITS)
    assert info.value.code == errors.ErrorCode.INVALID_REQUEST and "summary" in info.value.message


def test_the_builder_and_the_header() -> None:
    summary = sessionfork.Summary(keep_from=4, data={"t": "s"})
    request = requests.build("a", {"request_id": "r1", "summary": summary}, str)
    assert msgspec.to_builtins(request) == {"source": "a", "requestId": "r1",
                                            "summary": {"keepFrom": 4, "data": {"t": "s"}}}
    with pytest.raises(errors.ForkError, match=r"summary must be a sessionfork\.Summary"):
        requests.build("a", {"request_id": "r1", "summary": {"keepFrom": 4}}, str)  # type: ignore[typeddict-item]
    old = b'{"version":1,"id":"c","createdAt":5,"parentSession":"p","seedLength":3}'
    assert wire.decode_header(old).kept_from is msgspec.UNSET
    header = wire.Header(1, "c", 5, parent_session="p", seed_length=3, kept_from=7)
    assert wire.encode_header(header).endswith(b'"seedLength":3,"keptFrom":7}')
