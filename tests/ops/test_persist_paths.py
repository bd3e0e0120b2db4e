"""JSONL paths (``sessionfork.ops.persist``) against the original harness's vectors, plus the segment's contract."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec import UNSET

from sessionfork.core.wire import Header
from sessionfork.ops.jsonl import MAX_SEGMENT, SUFFIX, directory, path_for, segment

VECTORS: dict[str, Any] = json.loads((Path(__file__).parent.parent / "data" / "jsonl-paths.json").read_text("utf-8"))


def decode_segment(text: str) -> str:
    """The inverse of ``segment``, written independently from the vectors' description."""
    units = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "~":
            units += int(text[i + 1:i + 5], 16).to_bytes(2, "big")
            i += 5
        else:
            units += ord(text[i]).to_bytes(2, "big")
            i += 1
    return units.decode("utf-16-be", "surrogatepass")


@pytest.mark.parametrize("vector", VECTORS["segments"], ids=lambda v: repr(v["id"]))
def test_segment_matches_harness_vector(vector: dict[str, str]) -> None:
    assert segment(vector["id"]) == vector["segment"]


@pytest.mark.parametrize("vector", VECTORS["dirs"], ids=lambda v: repr(v["cwd"]))
def test_cwd_directory_matches_harness_vector(vector: dict[str, str]) -> None:
    assert directory(vector["cwd"]) == vector["dir"]


def test_session_without_cwd_lives_in_harness_no_cwd_directory() -> None:
    assert directory(None) == VECTORS["no_cwd_dir"]


def test_vectors_cover_segments_and_dirs() -> None:
    assert len(VECTORS["segments"]) >= 14 and len(VECTORS["dirs"]) >= 4


def test_path_joins_root_directory_and_segment() -> None:
    header = Header(version=0, id="a:b", created_at=1, cwd="/workspace")
    assert path_for(Path("/r"), header) == Path("/r/cwd-c52ddf65534b/a~003Ab.jsonl")


def test_path_without_cwd_is_under_no_cwd() -> None:
    header = Header(version=0, id="session-1", created_at=1, cwd=UNSET)
    assert path_for(Path("/r"), header) == Path("/r/_no-cwd/session-1.jsonl")


def test_empty_id_has_no_segment() -> None:
    with pytest.raises(ValueError, match="empty"):
        segment("")


@given(st.text(min_size=1))
def test_segment_uses_only_safe_characters_and_is_never_a_dot_name(session_id: str) -> None:
    out = segment(session_id)
    assert re.fullmatch(r"[A-Za-z0-9._~-]+", out)
    assert out not in (".", "..")


@given(st.text(min_size=1))
def test_segment_decodes_back_to_the_id_unless_hashed(session_id: str) -> None:
    out = segment(session_id)
    if "~~" not in out:
        assert decode_segment(out) == session_id
    assert len((out + SUFFIX).encode()) <= 255


@pytest.mark.parametrize("count", [49, 50, 51, 127, 128])
def test_an_id_whose_encoded_name_is_too_long_gets_a_hashed_name(count: int) -> None:
    session_id = "a" + ":" * (count - 1)
    encoded = "a" + "~003A" * (count - 1)
    out = segment(session_id)
    if len(encoded) <= MAX_SEGMENT:
        assert out == encoded
    else:
        assert re.fullmatch(r"a(~003A)+~~[0-9a-f]{64}", out), out
        assert out.endswith(hashlib.sha256(session_id.encode()).hexdigest())
    assert len(out + SUFFIX) <= 255


@given(st.text(alphabet=":.a", min_size=50, max_size=128), st.text(alphabet=":.a", min_size=50, max_size=128))
def test_hashed_names_differ_per_id_and_from_every_encoded_name(a: str, b: str) -> None:
    assert (segment(a) == segment(b)) == (a == b)
