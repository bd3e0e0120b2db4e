"""The request's optional ``traceparent``: W3C format checked, never part of the idempotency digest."""

from __future__ import annotations

import msgspec
import pytest

from sessionfork.core import rules, wire
from sessionfork.core.wire import ForkRequest

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("value", [GOOD, "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"])
def test_valid_traceparents(value: str) -> None:
    assert rules.is_valid_traceparent(value)


@pytest.mark.parametrize("value", [
    "", "00-not-a-trace", GOOD.upper(), GOOD + "-extra", GOOD[:-1],
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
])
def test_invalid_traceparents(value: str) -> None:
    assert not rules.is_valid_traceparent(value)


def test_traceparent_is_last_on_the_wire_and_not_in_the_digest() -> None:
    plain = ForkRequest(source="a", request_id="r1", session_id="c")
    traced = msgspec.structs.replace(plain, traceparent=GOOD)
    assert wire.encode(traced).decode().endswith(f'"traceparent":"{GOOD}"}}')
    assert wire.decode_request(wire.encode(traced)) == traced
    assert wire.digest(traced) == wire.digest(plain)
    assert b"traceparent" not in wire.encode(plain)
