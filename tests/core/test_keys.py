"""Golden values of the key schema (``sessionfork.core.keys``): these strings are a storage contract."""

from __future__ import annotations

import pytest
from redis.cluster import key_slot

from sessionfork.core import keys
from sessionfork.protocol import rq_layout

IDS = ["a", "s1", "session-3f2b8c1e-0000-4000-8000-000000000000", "A.b_c:d-e", "x" * 128]


def test_prefix_is_sf() -> None:
    assert keys.PREFIX == "sf"


def test_session_record_key() -> None:
    assert keys.session("a") == "sf:s:{a}"


def test_session_log_key() -> None:
    assert keys.session_log("a") == "sf:s:{a}:log"


def test_session_children_key() -> None:
    assert keys.session_children("a") == "sf:s:{a}:children"


def test_session_turns_key() -> None:
    assert keys.session_turns("a") == "sf:s:{a}:turns"


def test_session_needs_key() -> None:
    assert keys.session_needs("a") == "sf:s:{a}:needs"


def test_request_key_has_no_hash_tag() -> None:
    assert keys.request("r1") == "sf:req:r1"


def test_a_bundle_import_record_is_named_by_the_bundles_digest() -> None:
    assert keys.bundle_import("ab12") == "sf:bundle:ab12"


def test_default_queue_name() -> None:
    assert keys.DEFAULT_QUEUE == "sessionfork"


def test_default_reply_channel() -> None:
    assert keys.DEFAULT_REPLY_CHANNEL == "sf:replies"


def test_outcome_stream() -> None:
    assert keys.OUTCOME_STREAM == "sf:outcomes"


def test_shard_marker() -> None:
    assert keys.SHARD_MARKER == "sf:shard"


def test_audit_stream() -> None:
    assert keys.AUDIT_STREAM == "sf:audit"


def test_lifecycle_stream() -> None:
    assert keys.LIFECYCLE_STREAM == "sf:lifecycle"


def test_session_keys_keep_dots_colons_and_dashes_verbatim() -> None:
    assert keys.session("A.b_c:d-e") == "sf:s:{A.b_c:d-e}"
    assert keys.session_log("A.b_c:d-e") == "sf:s:{A.b_c:d-e}:log"
    assert keys.session_children("A.b_c:d-e") == "sf:s:{A.b_c:d-e}:children"
    assert keys.session_turns("A.b_c:d-e") == "sf:s:{A.b_c:d-e}:turns"
    assert keys.session_needs("A.b_c:d-e") == "sf:s:{A.b_c:d-e}:needs"


@pytest.mark.parametrize("session_id", IDS)
def test_all_keys_of_one_session_share_one_cluster_slot(session_id: str) -> None:
    slots = {
        key_slot(keys.session(session_id).encode()),
        key_slot(keys.session_log(session_id).encode()),
        key_slot(keys.session_children(session_id).encode()),
        key_slot(keys.session_turns(session_id).encode()),
        key_slot(keys.session_needs(session_id).encode()),
    }
    assert slots == {key_slot(session_id.encode())}


def test_different_sessions_are_not_forced_into_one_slot() -> None:
    slots = {key_slot(keys.session(f"s{i}").encode()) for i in range(20)}
    assert len(slots) > 1


def test_session_persisted_key() -> None:
    assert keys.session_persisted("a") == "sf:s:{a}:persisted"


def test_session_flush_asked_key() -> None:
    assert keys.session_flush_asked("a") == "sf:s:{a}:flushasked"


def test_retention_index_key() -> None:
    assert keys.DISPOSED_INDEX == "sf:disposed"


def test_rq_names_written_without_rq() -> None:
    # RQ's own names, built in the RQ seam's layout (pinned against RQ itself in test_aio_job_hash.py).
    assert rq_layout.job_key("r-1") == "rq:job:r-1"
    assert rq_layout.queue_key("sessionfork") == "rq:queue:sessionfork"
    assert rq_layout.QUEUES == "rq:queues"


def test_langgraph_keys() -> None:
    assert keys.langgraph_thread("t-1") == "sf:lg:t:t-1"
    assert keys.langgraph_run("r-1") == "sf:lg:run:r-1"
    assert keys.langgraph_thread_runs("t-1") == "sf:lg:truns:t-1"
    assert keys.LANGGRAPH_THREADS == "sf:lg:threads"
