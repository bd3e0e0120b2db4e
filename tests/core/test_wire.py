"""The wire format: header JSON shape, lossless event storage, NewEvent validation."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionfork.core import rules, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.wire import Event, Header, LiveHandle, NewEvent, SeedMeta

EVENT_KEYS = {"type", "seq", "time", "data"}


def test_minimal_header_json_has_version_id_created_at_only() -> None:
    raw = wire.encode_header(Header(version=0, id="a", created_at=1700000000123))
    assert raw == b'{"version":0,"id":"a","createdAt":1700000000123}'


def test_header_version_constant_is_zero() -> None:
    assert wire.HEADER_VERSION == 0


def test_full_header_json_uses_camel_case_keys() -> None:
    header = Header(version=0, id="c", created_at=5, cwd="/w", parent_session="p", seed_length=4)
    assert json.loads(wire.encode_header(header)) == {
        "version": 0, "id": "c", "createdAt": 5, "cwd": "/w", "parentSession": "p", "seedLength": 4,
    }


def test_header_optional_keys_are_absent_not_null() -> None:
    raw = wire.encode_header(Header(version=0, id="a", created_at=1, parent_session="p", seed_length=0))
    body = json.loads(raw)
    assert "cwd" not in body
    assert b"null" not in raw
    assert body["seedLength"] == 0


def test_header_round_trips_through_json() -> None:
    header = Header(version=0, id="c", created_at=5, cwd="", parent_session="p", seed_length=0)
    assert wire.decode_header(wire.encode_header(header)) == header


def test_decode_header_accepts_str() -> None:
    assert wire.decode_header('{"version":0,"id":"a","createdAt":1}') == Header(0, "a", 1)


def test_decode_header_requires_version() -> None:
    with pytest.raises(msgspec.ValidationError):
        wire.decode_header(b'{"id":"a","createdAt":1}')


def test_seed_meta_json_uses_camel_case_and_omits_missing_cwd() -> None:
    assert wire.encode(SeedMeta(parent_session="p", seed_length=3)) == b'{"parentSession":"p","seedLength":3}'
    assert json.loads(wire.encode(SeedMeta(parent_session="p", seed_length=3, cwd="/w")))["cwd"] == "/w"


def test_live_handle_json_shape() -> None:
    assert wire.encode(LiveHandle("a", "t")) == b'{"id":"a","instance":"t"}'


def test_stored_event_omits_seq_and_flattens_extra() -> None:
    raw = wire.encode_stored_event(NewEvent("tool/call", {"x": 1}, {"surfaceOp": "insert"}), 42)
    assert json.loads(raw) == {"type": "tool/call", "time": 42, "data": {"x": 1}, "surfaceOp": "insert"}


def test_stored_event_round_trip_keeps_unknown_fields_exactly() -> None:
    extra: dict[str, Any] = {
        "sourceEventSeqs": [3, 1, 2],
        "surfaceOp": {"op": "replace", "path": ["a", 0], "value": None},
        "zzz": None,
        "nested": {"deep": [{"x": 1.5}, True, False, ""]},
        "": "empty key",
    }
    new = NewEvent("assistant/message", {"text": "hi", "n": [1, 2]}, extra)
    event = wire.decode_stored_event(wire.encode_stored_event(new, 1700000000000), 7)
    assert event == Event("assistant/message", 7, 1700000000000, {"text": "hi", "n": [1, 2]}, extra)


def test_stored_event_without_data_decodes_as_none() -> None:
    event = wire.decode_stored_event(b'{"type":"turn/start","time":1}', 0)
    assert event == Event("turn/start", 0, 1, None, {})


def test_decode_stored_event_takes_seq_from_position_not_body() -> None:
    event = wire.decode_stored_event(b'{"type":"x","time":1,"data":null,"seq":99}', 3)
    assert event.seq == 3
    assert event.extra == {}


def test_event_to_builtins_is_the_harness_shape() -> None:
    event = Event("tool/call", 4, 10, {"a": 1}, {"sourceEventSeqs": [1]})
    assert wire.event_to_builtins(event) == {
        "type": "tool/call", "seq": 4, "time": 10, "data": {"a": 1}, "sourceEventSeqs": [1],
    }
    assert json.loads(wire.encode_event(event)) == wire.event_to_builtins(event)


@pytest.mark.parametrize("key", sorted(EVENT_KEYS))
def test_new_event_rejects_extra_keys_that_redefine_core_fields(key: str) -> None:
    with pytest.raises(ForkError) as info:
        NewEvent("x", None, {key: 1, "ok": 2})
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert info.value.message == f"event extra fields may not redefine ['{key}']"


def test_new_event_rejection_lists_every_clashing_key_sorted() -> None:
    with pytest.raises(ForkError) as info:
        NewEvent("x", None, {"time": 1, "seq": 2, "data": 3})
    assert info.value.message == "event extra fields may not redefine ['data', 'seq', 'time']"


@pytest.mark.parametrize("kind", ["", None, 3])
def test_new_event_rejects_empty_or_non_string_type(kind: object) -> None:
    with pytest.raises(ForkError) as info:
        NewEvent(kind)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert info.value.message == "event type must be a non-empty string"


def test_new_event_accepts_extra_keys_that_only_resemble_core_fields() -> None:
    event = NewEvent("x", None, {"Type": 1, "seqs": 2, "timestamp": 3, "data ": 4})
    assert event.extra == {"Type": 1, "seqs": 2, "timestamp": 3, "data ": 4}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=rules.INT_MIN, max_value=rules.INT_MAX)  # what 64-bit JSON readers read
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)
extra_fields = st.dictionaries(st.text().filter(lambda k: k not in EVENT_KEYS), json_values, max_size=5)


@given(
    kind=st.text(min_size=1),
    data=json_values,
    extra=extra_fields,
    time_ms=st.integers(min_value=0, max_value=2**53),
    seq=st.integers(min_value=0, max_value=2**40),
)
def test_any_json_event_round_trips_through_storage(
    kind: str, data: Any, extra: dict[str, Any], time_ms: int, seq: int
) -> None:
    event = wire.decode_stored_event(wire.encode_stored_event(NewEvent(kind, data, extra), time_ms), seq)
    assert event == Event(kind, seq, time_ms, data, extra)
    # Python's == treats 1 and 1.0 alike; the JSON text must match too.
    assert wire.encode(event.data) == wire.encode(data)
    assert wire.encode(event.extra) == wire.encode(extra)


def test_the_request_identity_is_defined_once_and_both_sides_use_it() -> None:
    """``wire.identity`` (and ``wire.digest``, its sha256: ``digest_of``) is the one Python definition of what makes
    two requests "the same": no other module defines it, and no other reads the identity fields but the
    table of operations (each row's ``identity``, the fields its request has); the clients and the
    worker call it (the enqueue script's copy is pinned by test_enqueue_script.py and test_operations.py)."""
    src = Path(wire.__file__).resolve().parents[1]
    texts = {p.relative_to(src).as_posix(): p.read_text() for p in src.rglob("*.py")}
    defining = {name for name, text in texts.items() for node in ast.parse(text).body  # module-level functions
                if isinstance(node, ast.FunctionDef) and node.name in ("identity", "digest")}
    assert defining == {"core/wire.py"}
    assert {name for name, text in texts.items() if "IDENTITY_FIELDS" in text} == {"core/wire.py",
                                                                                  "protocol/operations.py"}
    for side in ("clients/client.py", "clients/aio.py"):
        assert "wire.digest(request)" in texts[side], side
    worker = "".join(text for name, text in texts.items() if name.startswith("worker/"))
    # The worker keeps both: the identity once, its digest from it.
    assert "wire.identity(request)" in worker and "wire.digest_of(identity)" in worker


def test_a_single_forks_result_reads_its_child_typed_and_encodes_as_before() -> None:
    child = Header(version=0, id="c", created_at=1, parent_session="s", seed_length=2)
    reply = wire.ForkResult(request_id="r", session=child)
    assert reply.ok is True and reply.child is child and reply.children == [child] and reply.not_created == []
    assert wire.encode(reply) == (b'{"type":"fork/result","requestId":"r","ok":true,"session":{"version":0,"id":"c",'
                                  b'"createdAt":1,"parentSession":"s","seedLength":2}}')
    assert wire.decode_reply(wire.encode(reply)) == reply


def test_a_fan_outs_result_reads_its_children_and_failures_and_has_no_one_child() -> None:
    made = [Header(version=0, id=f"c{i}", created_at=1) for i in range(2)]
    lost = wire.ChildError(session_id="c2", code="SESSION_ALREADY_EXISTS", message="session \"c2\" already exists")
    reply = wire.ForkResult(request_id="r", ok=False, sessions=made, failed=[lost])
    assert reply.children == made and reply.not_created == [lost]
    with pytest.raises(ForkError) as caught:
        _ = reply.child
    assert caught.value.code is ErrorCode.INVALID_REQUEST and "fan-out" in caught.value.message
    raw = wire.encode(reply)
    assert json.loads(raw) == {"type": "fork/result", "requestId": "r", "ok": False,
                               "sessions": [{"version": 0, "id": "c0", "createdAt": 1},
                                            {"version": 0, "id": "c1", "createdAt": 1}],
                               "failed": [{"sessionId": "c2", "code": "SESSION_ALREADY_EXISTS",
                                           "message": "session \"c2\" already exists"}]}
    assert wire.decode_reply(raw) == reply
    assert wire.ForkResult(request_id="r", sessions=[]).children == []


def test_a_failures_ok_is_false_on_the_wire_and_in_its_type() -> None:
    failure = wire.ForkFailure(request_id="r", code="OPEN_TURN", message="m")
    assert failure.ok is False
    assert wire.encode(failure) == b'{"type":"fork/error","requestId":"r","ok":false,"code":"OPEN_TURN","message":"m"}'
    with pytest.raises(msgspec.ValidationError):
        wire.decode_reply(b'{"type":"fork/error","requestId":"r","ok":true,"code":"OPEN_TURN","message":"m"}')
