"""Merge and select in the library against a real server: the merge's turn written in
one atomic step, lineage checked at any depth, each rule with its code and message, a range merged
once, a request id merged once, the child's and the candidates' states. Through the queue:
``tests/worker/test_merge_queue.py``; on a cluster: ``test_merge_cluster``."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from helpers import turn
from waits import outcome_of

from sessionfork.core import forks, keys, merge_steps, merges, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Event, NewEvent


@pytest.fixture
def tree(registry: Registry) -> Registry:
    """"p" (2 turns, 8 events), its child "c" forked at 8 with two turns of its own (16 events), and
    "g", a child of "c" forked at 16 with one more turn (20 events)."""
    registry.append(registry.create("p", cwd="/w"), [*turn(1), *turn(2)])
    forks.fork(registry, "p", "c")
    registry.append("c", [*turn(3), *turn(4)])
    forks.fork(registry, "c", "g")
    registry.append("g", turn(5))
    return registry


def shape(events: list[Event]) -> list[tuple[str, Any]]:
    return [(e.type, e.data) for e in events]


def code_of(call: Any) -> tuple[ErrorCode, str]:
    with pytest.raises(ForkError) as info:
        call()
    return info.value.code, info.value.message


def test_events_merge_writes_one_turn_with_provenance(tree: Registry) -> None:
    child_events = tree.events("c")
    merged = merges.merge(tree, "p", "c", mode="events", request_id="m1")
    assert (merged.first, merged.length, merged.from_seq, merged.to_seq) == (8, 8 + 2 + 8 + 1, 8, 15)
    log = tree.events("p")
    assert [e.seq for e in log] == list(range(19))
    assert (log[8].type, log[8].data) == ("turn/start", {"trigger": "merge"})
    assert (log[9].type, log[9].data) == ("session/merge", {
        "mergedFrom": {"session": "c", "fromSeq": 8, "toSeq": 15}, "mode": "events", "forkedAt": 8, "parentLength": 8})
    body = log[10:18]
    assert [(e.type, e.data) for e in body] == shape(child_events[8:16])
    assert [e.extra["source"] for e in body] == [{"session": "c", "seq": s} for s in range(8, 16)]
    assert (log[18].type, log[18].data) == ("turn/end", {"reason": "merged"})
    state = tree.state_of("c")
    assert state.state == "merged" and state.merged_into.session == "p" and state.merged_into.seq == 8  # type: ignore[union-attr]
    assert tree.last_turn_end("p") == 18


def test_summary_merge_from_a_grandchild_records_the_fork_point_along_the_chain(tree: Registry) -> None:
    merged = merges.merge(tree, "p", "g", mode="summary", summary={"text": "turn 5 done"})
    assert (merged.from_seq, merged.to_seq) == (16, 19)
    log = tree.events("p")[8:]
    assert shape(log) == [
        ("turn/start", {"trigger": "merge"}),
        ("session/merge", {"mergedFrom": {"session": "g", "fromSeq": 16, "toSeq": 19}, "mode": "summary",
                           "forkedAt": 8, "parentLength": 8}),
        ("session/summary", {"summary": {"text": "turn 5 done"}, "summarizes": {"session": "g", "fromSeq": 16,
                                                                               "toSeq": 19}}),
        ("turn/end", {"reason": "merged"}),
    ]


def test_a_merge_turn_is_one_turn_for_forks_boundaries_inside_it_are_refused(tree: Registry) -> None:
    merges.merge(tree, "p", "c", mode="events")
    assert code_of(lambda: forks.fork(tree, "p", "x", boundary=13))[0] is ErrorCode.INVALID_BOUNDARY
    child = forks.fork(tree, "p", "y")
    assert child.seed_length == 19


@pytest.mark.parametrize(("call", "code", "words"), [
    (lambda r: merges.merge(r, "nope", "c", mode="events"), ErrorCode.SESSION_NOT_FOUND, 'session "nope" not found'),
    (lambda r: merges.merge(r, "p", "nope", mode="events"), ErrorCode.SESSION_NOT_FOUND, 'session "nope" not found'),
    (lambda r: merges.merge(r, "c", "p", mode="events"), ErrorCode.NOT_DESCENDANT, 'session "p" does not descend'),
    (lambda r: merges.merge(r, "g", "c", mode="events"), ErrorCode.NOT_DESCENDANT, 'session "c" does not descend'),
    (lambda r: merges.merge(r, "p", "c", mode="events", if_child_length=3), ErrorCode.PRECONDITION_FAILED,
     'session "c" has 16 events, not 3'),
    (lambda r: merges.merge(r, "p", "c", mode="events", if_parent_length=3), ErrorCode.PRECONDITION_FAILED,
     'session "p" has 8 events, not 3'),
    (lambda r: merges.merge(r, "p", "c", mode="events", range=(7, 11)), ErrorCode.INVALID_BOUNDARY,
     "fromSeq 7 is inside its seed"),
    (lambda r: merges.merge(r, "p", "c", mode="events", range=(8, 16)), ErrorCode.INVALID_BOUNDARY,
     "toSeq 16 is past the end of a log of 16 events"),
    (lambda r: merges.merge(r, "p", "c", mode="events", range=(8, 13)), ErrorCode.INVALID_BOUNDARY,
     "toSeq 13 is inside the turn opened at seq 12"),
    (lambda r: merges.merge(r, "p", "c", mode="events", range=(12, 11)), ErrorCode.INVALID_BOUNDARY,
     "fromSeq 12 is after toSeq 11"),
    (lambda r: merges.merge(r, "p", "c", mode="summary"), ErrorCode.INVALID_REQUEST, "needs a summary"),
    (lambda r: merges.merge(r, "p", "c", mode="events", summary=1), ErrorCode.INVALID_REQUEST,
     "only mode summary takes a summary"),
    (lambda r: merges.merge(r, "p", "c", mode=cast(Any, "other")), ErrorCode.INVALID_REQUEST, "invalid mode"),
])
def test_each_rule_has_its_code_and_a_message_naming_what(tree: Registry, call: Any, code: ErrorCode,
                                                          words: str) -> None:
    before = {sid: tree.length(sid) for sid in ("p", "c", "g")}
    got, message = code_of(lambda: call(tree))
    assert got is code and words in message, message
    assert {sid: tree.length(sid) for sid in ("p", "c", "g")} == before  # nothing written
    assert tree.state_of("c").state == "live"


def test_an_open_parent_turn_is_open_turn_and_nothing_is_written(tree: Registry) -> None:
    tree.append("p", [NewEvent("turn/start", {"turn": 9})])
    assert code_of(lambda: merges.merge(tree, "p", "c", mode="events"))[0] is ErrorCode.OPEN_TURN
    assert tree.length("p") == 9


def test_a_child_without_a_completed_turn_has_nothing_to_merge(registry: Registry) -> None:
    registry.append(registry.create("p"), turn(1))
    forks.fork(registry, "p", "c")
    registry.append("c", [NewEvent("turn/start", {})])
    code, message = code_of(lambda: merges.merge(registry, "p", "c", mode="events"))
    assert code is ErrorCode.INVALID_BOUNDARY and "no completed turn after its seed" in message


def test_the_default_range_ends_at_the_last_completed_turn(tree: Registry) -> None:
    tree.append("c", [NewEvent("turn/start", {"turn": 6}), NewEvent("user/message", {})])
    merged = merges.merge(tree, "p", "c", mode="events")
    assert (merged.from_seq, merged.to_seq) == (8, 15)


def test_the_same_range_merges_once_under_any_request_id(tree: Registry) -> None:
    first = merges.merge(tree, "p", "c", mode="summary", summary="s", request_id="one")
    code, message = code_of(lambda: merges.merge(tree, "p", "c", mode="summary", summary="s", request_id="two"))
    assert code is ErrorCode.ALREADY_MERGED
    assert 'by request "one"' in message and f"at seq {first.first}" in message
    length = tree.length("p")
    again = merges.merge(tree, "p", "c", mode="summary", summary="s", request_id="one")
    assert again == first and tree.length("p") == length  # a retry: the first merge, nothing written
    other = merges.merge(tree, "p", "c", mode="events", range=(8, 11))  # another range of it: merges
    assert other.first == length


def test_a_retried_request_replays_even_when_the_child_moved_on(tree: Registry) -> None:
    first = merges.merge(tree, "p", "c", mode="events", request_id="r1")
    tree.append("c", turn(7))
    again = outcome_of(lambda: merges.merge(tree, "p", "c", mode="events", request_id="r1", if_child_length=3))
    assert again == first


def test_select_merges_the_winner_and_abandons_the_rest(registry: Registry) -> None:
    registry.append(registry.create("p"), turn(1))
    for i in range(3):
        forks.fork(registry, "p", f"k{i}")
        registry.append(f"k{i}", turn(10 + i))
    done = merges.select(registry, "p", ["k0", "k1", "k2"], "k1", mode="events", request_id="s1")
    assert done.child == "k1" and done.abandoned == ("k0", "k2")
    assert [registry.state_of(f"k{i}").state for i in range(3)] == ["abandoned", "merged", "abandoned"]
    assert registry.state_of("k0").abandoned_by == "s1"
    assert [e.extra.get("source", {}).get("session") for e in registry.events("p")[6:10]] == ["k1"] * 4
    # a stale selection: any candidate merged or abandoned
    code, message = code_of(lambda: merges.select(registry, "p", ["k0", "k2"], "k2", mode="summary", summary=1))
    assert code is ErrorCode.ALREADY_MERGED and "abandoned" in message
    code, message = code_of(lambda: merges.merge(registry, "p", "k0", mode="summary", summary=1))
    assert code is ErrorCode.ALREADY_MERGED and 'abandoned by request "s1"' in message
    assert merges.select(registry, "p", ["k0", "k1", "k2"], "k1", mode="events", request_id="s1") == done


def test_a_select_marks_its_other_candidates_in_one_call_on_one_server(registry: Registry) -> None:
    """On one server a select's other candidates are marked abandoned by one ``mark_many.lua`` call
    (a select of 9 candidates runs as many script calls as one of 3), each entered in the ended
    index; the script marks only the records that exist (one deleted meanwhile stays deleted) and
    answers 1 or 0 for each."""
    redis = registry.redis
    registry.append(registry.create("p"), turn(1))
    calls = []
    for n in (2, 3, 9):  # the first loads the scripts (a first call is NOSCRIPT, then run again)
        ids = [f"m{n}-{i}" for i in range(n)]
        forks.fork_many(registry, "p", ids)
        for cid in ids:
            registry.append(cid, turn(7))
        redis.config_resetstat()
        done = merges.select(registry, "p", ids, ids[0], mode="summary", summary={"n": n}, request_id=f"sel-{n}")
        calls.append(int(redis.info("commandstats")["cmdstat_evalsha"]["calls"]))
        assert done.abandoned == tuple(ids[1:])
        assert [registry.state_of(c).abandoned_by for c in ids[1:]] == [f"sel-{n}"] * (n - 1)
        assert all(redis.zscore(keys.ENDED_INDEX, c) is not None for c in ids)
    assert calls[1] == calls[2]  # the marks are two calls whatever the number of candidates
    registry.append(registry.create("gone"), turn(1))
    registry.append(registry.create("kept"), turn(1))
    redis.delete(keys.session("gone"))
    replies = registry.forks.state.scripts("mark_many", ended=keys.ENDED_INDEX,
                                           records=[keys.session("gone"), keys.session("kept")], kind="abandoned",
                                           value="r-x", now=5, holder="r-x", session_ids=["gone", "kept"])
    assert replies == [0, 1]
    assert redis.exists(keys.session("gone")) == 0 and redis.zscore(keys.ENDED_INDEX, "gone") is None
    assert redis.hget(keys.session("kept"), "abandoned") == b"r-x" and redis.zscore(keys.ENDED_INDEX, "kept") == 5


def test_select_winner_must_be_a_candidate(registry: Registry) -> None:
    code, message = code_of(lambda: merges.select(registry, "p", ["a", "b"], "c", mode="events"))
    assert code is ErrorCode.INVALID_REQUEST and "not one of the candidates" in message


def test_the_merges_index_and_records_hold_what_the_key_schema_says(tree: Registry) -> None:
    merges.merge(tree, "p", "c", mode="events", request_id="m1")
    index = {wire.text(k): wire.text(v) for k, v in tree.redis.hgetall(keys.session_merges("p")).items()}
    now = tree.state.clock()
    when = int(index['["r","m1"]'].split()[4])
    assert now - 60_000 < when <= now
    # One entry per merge in the parent, and its request id's for the request window.
    assert index == {'["m","c",8,15]': "m1 8 19", '["r","m1"]': f"8 19 8 15 {when}"}
    assert [wire.text(m) for m in tree.redis.zrange(keys.session_merge_requests("p"), 0, -1)] == ["m1"]
    # The plan the child's step kept in the child (the range, its hold on it) is let go by the mark.
    assert not [k for k in tree.redis.hkeys(keys.session("c")) if wire.text(k).startswith(("plan:", "hold"))]
    assert json.loads(tree.redis.hget(keys.session("c"), "mergedinto") or "") == ["p", 8, "m1"]
    assert tree.redis.zscore(keys.ENDED_INDEX, "c") is not None


@pytest.mark.parametrize(("limit", "value", "words"), [("MAX_MERGE_EVENTS", 7, "more than 7 events"),
                                                       ("MAX_MERGE_BYTES", 400, "over 400 bytes")])
def test_an_events_merge_over_the_limits_is_refused_and_writes_nothing(tree: Registry, monkeypatch: pytest.MonkeyPatch,
                                                                        limit: str, value: int, words: str) -> None:
    if limit == "MAX_MERGE_BYTES":  # the registry's (SESSIONFORK_MAX_REQUEST_WRITE_BYTES)
        monkeypatch.setattr(tree.state, "max_merge_bytes", value)
    else:
        monkeypatch.setattr(merge_steps, limit, value)
    code, message = code_of(lambda: merges.merge(tree, "p", "c", mode="events"))
    assert code is ErrorCode.INVALID_BOUNDARY and words in message, message
    assert tree.length("p") == 8
    assert merges.merge(tree, "p", "c", mode="events", range=(8, 11)).length == 8 + 2 + 4 + 1  # a part fits


def test_a_retry_answers_its_first_merge_whatever_the_parent_and_child_hold_now(tree: Registry) -> None:
    first = merges.merge(tree, "p", "c", mode="events", request_id="r2")
    tree.append("c", turn(8))  # the default range would now end later
    tree.dispose("p")  # and the parent is no longer live
    assert outcome_of(lambda: merges.merge(tree, "p", "c", mode="events", request_id="r2")) == first
    assert code_of(lambda: merges.merge(tree, "p", "c", mode="events", request_id="r3")) == \
        (ErrorCode.SESSION_NOT_LIVE, 'session "p" is disposed: nothing merges into it')


def test_a_select_retried_after_its_marks_answers_its_first_merge(registry: Registry) -> None:
    registry.append(registry.create("p"), turn(1))
    for cid in ("a", "b"):
        forks.fork(registry, "p", cid)
        registry.append(cid, turn(2))
    first = merges.select(registry, "p", ["a", "b"], "a", mode="summary", summary=1, request_id="sel")
    registry.append("a", turn(3))
    assert merges.select(registry, "p", ["a", "b"], "a", mode="summary", summary=1, request_id="sel") == first
    assert registry.length("p") == first.length
