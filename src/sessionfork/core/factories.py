"""The default clock and id factories; the registry and the client take them as arguments."""

from __future__ import annotations

import os
import secrets
import time
import uuid


def now_ms() -> int:
    """Unix epoch milliseconds."""
    return time.time_ns() // 1_000_000


def new_session_id() -> str:
    """``session-<uuid4>``: unique across processes and machines without coordination."""
    return f"session-{uuid.uuid4()}"


def new_instance_token() -> str:
    """An unguessable token naming one live incarnation of a session."""
    return os.urandom(16).hex()  # secrets.token_hex(16), without its two Python calls per child


def new_request_id() -> str:
    """``req-<uuid4>``: a request's idempotency key when the scheduler gives none."""
    return f"req-{uuid.uuid4()}"


def new_call_id() -> str:
    """Names one append call, so that a client's retry of it after a lost reply is recognised."""
    return secrets.token_hex(8)
