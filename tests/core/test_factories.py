"""The default id factories: what ``new_session_id`` makes is ``session-`` and a version-4 UUID's
text, as ``uuid.uuid4()`` makes it, every time."""

from __future__ import annotations

import uuid

from sessionfork.core.factories import new_session_id


def test_a_new_session_id_is_a_random_uuid4s_text() -> None:
    ids = [new_session_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    variants, digits = set(), set()
    for sid in ids:
        assert sid.startswith("session-")
        text = sid.removeprefix("session-")
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # lower-case hex, dashes where uuid puts them
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        variants.add(text[19])
        digits.update(text.replace("-", ""))
    assert variants == set("89ab")  # every variant digit occurs: its two random bits are kept
    assert digits == set("0123456789abcdef")
