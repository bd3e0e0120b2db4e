"""JSONL paths (``sessionfork.ops.persist``) against the original harness's vectors, plus the segment's contract."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec import UNSET

from sessionfork.core.wire import Header
from sessionfork.ops.persist import directory, path_for, segment

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
def test_segment_decodes_back_to_the_id(session_id: str) -> None:
    assert decode_segment(segment(session_id)) == session_id
