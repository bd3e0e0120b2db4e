"""Merge and select requests at the edge: any JSON shape with a merge's or a select's
``op``, and any Python value handed to the clients' builders, is accepted or refused with a typed
``INVALID_REQUEST`` naming the field, never another exception; what is accepted round-trips through
the wire and keeps its identity (a retry is the same request)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionfork.core import wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.specs import MergeSpec, SelectSpec
from sessionfork.protocol import merge_requests
from sessionfork.protocol.requests import Limits

LIMITS = Limits()
JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
IDS = st.sampled_from(["p", "c", "k0", "k1", "", "a b", "x" * 200, "é"]) | st.text(max_size=6)
FIELDS = {
    "parent": IDS | st.fixed_dictionaries({"id": IDS, "instance": st.text(max_size=4)}) | JSON,
    "child": IDS | JSON, "winner": IDS | JSON, "candidates": st.lists(IDS, max_size=4) | JSON,
    "mode": st.sampled_from(["summary", "events", "other", ""]) | JSON, "summary": JSON,
    "range": st.fixed_dictionaries({"fromSeq": st.integers(-3, 2**66), "toSeq": st.integers(-3, 2**66)}) | JSON,
    "ifParentLength": st.integers(-3, 2**66) | JSON, "ifChildLength": st.integers(-3, 2**66) | JSON,
    "replyTo": st.text(max_size=5) | JSON, "traceparent": st.text(max_size=5), "requestId": st.just("r-1") | JSON,
    "extra": JSON,
}


@st.composite
def merge_shapes(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"op": draw(st.sampled_from(["merge", "select"]))}
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True, max_size=len(FIELDS))):
        body[name] = draw(FIELDS[name])
    return body


@settings(max_examples=300, deadline=None)
@given(merge_shapes())
def test_any_merge_shape_is_accepted_or_refused_with_invalid_request(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    try:
        request = merge_requests.parse(raw, "r-1", LIMITS, wire.request_op(raw))
        spec = merge_requests.spec_of(request, "r-1", LIMITS)
    except ForkError as exc:
        assert exc.code is ErrorCode.INVALID_REQUEST, exc
        assert exc.message
        return
    assert isinstance(spec, MergeSpec | SelectSpec)
    again = wire.decode_any_request(wire.encode(request))
    assert wire.identity(again) == wire.identity(request)


VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=4), st.binary(max_size=3), st.lists(st.integers()),
                   st.tuples(st.integers(), st.integers()), st.floats(), st.booleans(), st.just(object()))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["mode", "summary", "range", "if_parent_length", "if_child_length",
                                        "request_id", "reply_to", "nope"]), VALUES, max_size=4),
       VALUES, VALUES)
def test_any_python_value_for_the_builders_is_a_typed_error_or_a_request(options: dict[str, Any], parent: Any,
                                                                         child: Any) -> None:
    try:
        request = merge_requests.build("merge", parent, options, lambda: "r-1", child=child)  # type: ignore[arg-type]
    except TypeError as exc:
        assert "unexpected keyword argument 'nope'" in str(exc) or "mode" in str(exc), exc
        return
    except (ForkError, KeyError) as exc:
        assert isinstance(exc, ForkError) and exc.code is ErrorCode.INVALID_REQUEST, exc
        return
    assert isinstance(request, wire.MergeRequest)


@pytest.mark.parametrize(("body", "words"), [
    ({"op": "merge", "parent": "p", "child": "c", "mode": "events", "summary": 1}, "only mode summary"),
    ({"op": "merge", "parent": "p", "child": "c", "mode": "summary", "summary": None}, "needs a summary"),
    ({"op": "merge", "parent": "p", "child": "c", "mode": "events", "range": {"fromSeq": 3}}, "toSeq"),
    ({"op": "merge", "parent": {"id": "p", "instance": ""}, "child": "c", "mode": "events"}, "non-empty instance"),
    ({"op": "select", "parent": "p", "candidates": [], "winner": "c", "mode": "events"}, "expected 1 to 1024"),
    ({"op": "select", "parent": "p", "candidates": ["c"], "child": "c", "winner": "c", "mode": "events"}, "child"),
    ({"op": "merge", "parent": "p", "child": "c", "mode": "events", "requestId": "other"}, "does not match"),
    ({"op": "fusion", "parent": "p"}, "unknown op"),
])
def test_refusals_name_the_field(body: dict[str, Any], words: str) -> None:
    with pytest.raises(ForkError) as info:
        raw = json.dumps(body).encode()
        op = wire.request_op(raw)
        if op == "fork":
            wire.decode_request(raw)
        request = merge_requests.parse(raw, "r-1", LIMITS, op)
        merge_requests.spec_of(request, "r-1", LIMITS)
    assert info.value.code is ErrorCode.INVALID_REQUEST and words in info.value.message, info.value.message


def test_a_fork_with_op_fork_is_the_same_request_as_one_without() -> None:
    plain = wire.decode_request(b'{"source": "s", "sessionId": "c"}')
    explicit = wire.decode_request(b'{"source": "s", "sessionId": "c", "op": "fork"}')
    assert wire.identity(plain) == wire.identity(explicit)
    assert wire.identity(plain) == b'["s","c",null,null]'  # the digest forks had before merges existed
