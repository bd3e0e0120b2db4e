"""The default clock and id factories; the registry and the client take them as arguments."""

from __future__ import annotations

import os
import secrets
import time
import uuid


def now_ms() -> int:
    """Unix epoch milliseconds."""
    return time.time_ns() // 1_000_000


_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}
"""A random hex digit's two low bits under RFC 4122's variant bits (``10xx``)."""


def new_session_id() -> str:
    """``session-<uuid4>``: unique across processes and machines without coordination.

    The UUID's text is formatted from 16 random bytes with its version (4) and variant bits set, as
    ``uuid.uuid4()`` makes it: a fan-out makes one per child, and the ``UUID`` object took 60 % of
    this call."""
    h = os.urandom(16).hex()
    return f"session-{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


def new_instance_token() -> str:
    """An unguessable token naming one live incarnation of a session."""
    return os.urandom(16).hex()  # secrets.token_hex(16), without its two Python calls per child


def new_request_id() -> str:
    """``req-<uuid4>``: a request's idempotency key when the scheduler gives none."""
    return f"req-{uuid.uuid4()}"


def new_call_id() -> str:
    """Names one append call, so that a client's retry of it after a lost reply is recognised."""
    return secrets.token_hex(8)
