"""The public API is what __all__ says; a change to it is a conscious one."""

import sessionfork


def test_all_is_pinned() -> None:
    assert sessionfork.__all__ == [
        "ErrorCode", "Event", "ForkError", "Header", "LiveHandle", "NewEvent", "Registry", "SeedMeta",
        "Snapshot", "Summary", "fork", "snapshot",
    ]


def test_every_name_in_all_exists() -> None:
    for name in sessionfork.__all__:
        assert getattr(sessionfork, name) is not None


def test_error_codes_are_the_contract() -> None:
    assert [c.value for c in sessionfork.ErrorCode] == [
        "SESSION_NOT_FOUND", "SESSION_NOT_LIVE", "SESSION_ALREADY_EXISTS", "OPEN_TURN", "INVALID_BOUNDARY",
        "PRECONDITION_FAILED",
        "INVALID_REQUEST", "IDEMPOTENCY_CONFLICT", "INTERNAL", "WRONG_SHARD",
    ]
