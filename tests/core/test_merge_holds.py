"""What a merge or a select holds on one real server: its children while it runs (two requests that
would change one child's state cannot both succeed, whatever their interleaving), its first merge
for a retry after a crash (whatever the sessions hold by then), its request id for the request
window only (``request_ttl``), and nothing once it ended (no plan left in a child's record, a
refusal included); a select's lineage checked in a bounded number of round trips; an events merge
bounded by ``SESSIONFORK_MAX_REQUEST_WRITE_BYTES``; and the parent's step's own rules (its error
order, the merged events' time, the child's latest merge). On a cluster: ``test_merge_cluster``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from clocks import Clock
from helpers import died_before_the_marks, family, turn
from redis import Redis
from waits import outcome_of

from sessionfork.core import forks, keys, merges, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.merge_steps import Merged, MergeSteps
from sessionfork.core.registry import Registry
from sessionfork.core.settings import Settings
from sessionfork.core.specs import SelectSpec
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer


def code_of(call: Callable[[], object]) -> tuple[ErrorCode, str]:
    with pytest.raises(ForkError) as info:
        call()
    return info.value.code, info.value.message


def between_child_and_parent_step(steps: MergeSteps, action: Callable[[], object]) -> list[object]:
    """Run ``action`` (once) after ``steps``' next run took its children's steps, before its
    parent's step: what it gave (or raised), to assert on. The interleaving of two requests in
    flight at once, pinned."""
    ran: list[object] = []
    original = steps._write_op

    def hooked(*args: Any) -> Any:
        if not ran:
            try:
                ran.append(action())
            except ForkError as exc:
                ran.append(f"{exc.code.value}: {exc.message}")
        return original(*args)

    steps._write_op = hooked  # type: ignore[method-assign]  # this instance's only
    return ran


def merge_turns(registry: Registry, parent: str) -> list[int]:
    return [e.seq for e in registry.events(parent) if e.type == "turn/start" and e.data == {"trigger": "merge"}]


def states(registry: Registry, *ids: str) -> list[str]:
    return [registry.state_of(sid).state for sid in ids]


def record_fields(redis: Redis, sid: str) -> list[str]:
    return sorted(wire.text(k) for k in redis.hkeys(keys.session(sid)))


# -- one child's state, one winner -------------------------------------------------------------------


def test_a_select_run_whole_while_a_merge_of_its_candidate_is_in_flight_is_refused(registry: Registry) -> None:
    family(registry, "p", ["a", "b"])
    other = Registry(registry.redis)
    during = between_child_and_parent_step(registry.merges, lambda: merges.select(
        other, "p", ["a", "b"], "a", mode="events", request_id="sel"))
    merged = outcome_of(lambda: merges.merge(registry, "p", "b", mode="events", request_id="mrg"))
    assert len(during) == 1 and isinstance(during[0], str)  # the select ran whole while the merge was in flight
    assert "ALREADY_MERGED" in during[0] and 'request "mrg"' in during[0], during
    assert isinstance(merged, Merged) and merged.child == "b"
    assert states(registry, "a", "b") == ["live", "merged"] and merge_turns(registry, "p") == [4]


def test_a_merge_run_whole_while_a_select_abandoning_its_child_is_in_flight_is_refused(registry: Registry) -> None:
    family(registry, "p", ["a", "b"])
    other = Registry(registry.redis)
    during = between_child_and_parent_step(registry.merges, lambda: merges.merge(
        other, "p", "b", mode="events", request_id="mrg"))
    selected = outcome_of(lambda: merges.select(registry, "p", ["a", "b"], "a", mode="events", request_id="sel"))
    assert len(during) == 1 and isinstance(during[0], str)  # the merge ran whole while the select was in flight
    assert "ALREADY_MERGED" in during[0] and 'request "sel"' in during[0], during
    assert isinstance(selected, Merged) and selected.abandoned == ("b",)
    assert states(registry, "a", "b") == ["merged", "abandoned"] and merge_turns(registry, "p") == [4]


def test_a_select_into_the_grandparent_won_by_a_candidate_another_select_abandons_is_refused(
        registry: Registry) -> None:
    """A select abandoning ``b`` under ``p`` in flight while a select into ``p``'s parent ``g``, won
    by ``b``, runs whole (the two parents' merges indexes never meet: only ``b``'s record can
    tell); and the other way round."""
    family(registry, "g", ["p", "q"])
    forks.fork_many(registry, "p", ["a", "b"])
    for cid in ("a", "b"):
        registry.append(cid, turn(20))
    other = Registry(registry.redis)
    during = between_child_and_parent_step(registry.merges, lambda: merges.select(
        other, "g", ["b", "q"], "b", mode="summary", summary="b", request_id="up"))
    below = outcome_of(lambda: merges.select(registry, "p", ["a", "b"], "a", mode="events", request_id="down"))
    assert isinstance(during[0], str) and "ALREADY_MERGED" in during[0] and 'request "down"' in during[0], during
    assert isinstance(below, Merged) and states(registry, "a", "b", "q") == ["merged", "abandoned", "live"]
    assert merge_turns(registry, "g") == []

    forks.fork_many(registry, "p", ["c", "d"])
    for cid in ("c", "d"):
        registry.append(cid, turn(21))
    during = between_child_and_parent_step(registry.merges, lambda: merges.select(
        other, "p", ["c", "d"], "c", mode="events", request_id="down-2"))
    above = outcome_of(lambda: merges.select(registry, "g", ["d", "q"], "d", mode="summary", summary="d",
                                             request_id="up-2"))
    assert isinstance(during[0], str) and "ALREADY_MERGED" in during[0] and 'request "up-2"' in during[0], during
    assert isinstance(above, Merged) and states(registry, "c", "d", "q") == ["live", "merged", "abandoned"]


def _race_round(port: int, r: int, barrier: threading.Barrier, side: str) -> str:
    """One side of a round: the merge of ``b<r>`` or the select over ``{a<r>, b<r>}`` won by
    ``a<r>``, into ``p<r>``, on a connection of its own; it waits at ``barrier`` once it read the
    records (both requests in flight before either took a step); ``OK`` or its code."""
    client = Redis(port=port)
    registry = Registry(client)
    steps = registry.merges
    original = steps._read_many
    waited: list[bool] = []

    def read_then_wait(*args: Any) -> Any:
        got = original(*args)
        if not waited:
            waited.append(True)
            barrier.wait(30)
        return got

    steps._read_many = read_then_wait  # type: ignore[method-assign]
    try:
        if side == "merge":
            merges.merge(registry, f"p{r}", f"b{r}", mode="events", request_id=f"m{r}")
        else:
            merges.select(registry, f"p{r}", [f"a{r}", f"b{r}"], f"a{r}", mode="events", request_id=f"s{r}")
    except ForkError as exc:
        return exc.code.value
    finally:
        client.close()
    return "OK"


def test_a_merge_and_a_select_of_the_same_branch_racing_on_threads_one_wins(
        registry: Registry, server: EmbeddedServer) -> None:
    rounds = 20
    for r in range(rounds):
        family(registry, f"p{r}", [f"a{r}", f"b{r}"])
    wins: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        for r in range(rounds):
            barrier = threading.Barrier(2)
            merge = pool.submit(_race_round, server.port, r, barrier, "merge")
            select = pool.submit(_race_round, server.port, r, barrier, "select")
            got = {"merge": merge.result(60), "select": select.result(60)}
            assert not barrier.broken  # both had read the records before either went on: they raced
            assert sorted(got.values()) == ["ALREADY_MERGED", "OK"], (r, got)
            winner = "merge" if got["merge"] == "OK" else "select"
            wins.append(winner)
            expected = ["live", "merged"] if winner == "merge" else ["merged", "abandoned"]
            assert states(registry, f"a{r}", f"b{r}") == expected, (r, got)
            assert merge_turns(registry, f"p{r}") == [4]


# -- a retry after a crash answers its first merge -------------------------------------------------------


def test_a_merge_retried_after_a_crash_answers_its_first_merge_whatever_the_sessions_hold_now(
        registry: Registry) -> None:
    """Died after the parent's step, before the marks: then the child deleted, the parent disposed,
    or the child asked for by a select (refused: the merge holds it until its retry ends it)."""
    family(registry, "p", ["gone", "held", "x"])
    first = died_before_the_marks(registry.merges, merges.merge_spec("p", "gone", {"mode": "events",
                                                                                   "request_id": "m-gone"}))
    registry.delete("gone")
    assert outcome_of(lambda: merges.merge(registry, "p", "gone", mode="events", request_id="m-gone")) == first

    held = died_before_the_marks(registry.merges, merges.merge_spec("p", "held", {"mode": "events",
                                                                                  "request_id": "m-held"}))
    code, message = code_of(lambda: merges.select(registry, "p", ["held", "x"], "x", mode="events",
                                                  request_id="s-late"))
    assert code is ErrorCode.ALREADY_MERGED and 'request "m-held"' in message
    registry.dispose("p")
    assert outcome_of(lambda: merges.merge(registry, "p", "held", mode="events", request_id="m-held")) == held
    assert states(registry, "held", "x") == ["merged", "live"]
    assert merge_turns(registry, "p") == [4, 11]


def test_a_select_retried_after_a_crash_marks_its_winner_and_losers_whatever_was_asked_meanwhile(
        registry: Registry) -> None:
    family(registry, "p", ["a", "b", "c"])
    forks.fork(registry, "p", "elsewhere")
    spec = merges.select_spec("p", ["a", "b", "c"], "a", {"mode": "events", "request_id": "sel"})
    first = died_before_the_marks(registry.merges, spec)
    code, _ = code_of(lambda: merges.merge(registry, "p", "b", mode="summary", summary="b", request_id="m-b"))
    assert code is ErrorCode.ALREADY_MERGED  # a loser merged elsewhere meanwhile: refused, the select holds it
    registry.delete("c")
    again = outcome_of(lambda: merges.select(registry, "p", ["a", "b", "c"], "a", mode="events", request_id="sel"))
    assert again == first and isinstance(again, Merged) and again.abandoned == ("b", "c")
    assert states(registry, "a", "b") == ["merged", "abandoned"] and registry.state_of("b").abandoned_by == "sel"
    assert merge_turns(registry, "p") == [4]


# -- the request window, and nothing left behind -------------------------------------------------------


def test_a_request_id_used_again_after_the_request_window_is_a_new_request(redis: Redis, clock: Clock) -> None:
    registry = Registry(redis, clock=clock, request_ttl=60)
    registry.append(registry.create("g"), turn(1))
    forks.fork(registry, "g", "p")
    registry.append("p", turn(2))
    forks.fork(registry, "p", "c")
    registry.append("c", [*turn(3), *turn(4)])
    first = merges.merge(registry, "p", "c", mode="summary", summary=1, range=(8, 11), request_id="rid")
    assert merges.merge(registry, "p", "c", mode="summary", summary=1, range=(8, 11), request_id="rid") == first
    clock.now += 61_000  # the window passed: the same id names a new request
    again = merges.merge(registry, "p", "c", mode="summary", summary=2, range=(12, 15), request_id="rid")
    assert (again.from_seq, again.to_seq, again.first) == (12, 15, first.length)
    into = merges.merge(registry, "g", "c", mode="summary", summary=3, range=(12, 15), request_id="rid-g")
    clock.now += 61_000
    other = merges.merge(registry, "g", "c", mode="summary", summary=4, range=(8, 11), request_id="rid-g")
    assert (into.from_seq, other.from_seq, other.first) == (12, 8, into.length)
    # What a request id holds past the window is gone: no plan in the child, and a later merge
    # drops the parent's request entries past the window.
    assert [f for f in record_fields(redis, "c") if f.startswith(("plan:", "hold"))] == []
    registry.append("c", turn(5))
    merges.merge(registry, "p", "c", mode="summary", summary=5, range=(16, 19), request_id="rid-3")
    index = [wire.text(k) for k in redis.hkeys(keys.session_merges("p"))]
    assert sorted(k for k in index if k.startswith('["r"')) == ['["r","rid-3"]']
    assert [wire.text(m) for m in redis.zrange(keys.session_merge_requests("p"), 0, -1)] == ["rid-3"]


def test_a_run_that_died_after_its_childs_step_is_retried_on_the_range_it_resolved(registry: Registry) -> None:
    family(registry, "p", ["c"])
    steps = registry.merges
    run = steps._run_of(merges.merge_spec("p", "c", {"mode": "events", "request_id": "d1"}))
    steps._many(steps._hold_ops(run))  # the child's step; then the process died, nothing written
    registry.append("c", turn(3))  # the default range would now end later
    done = merges.merge(registry, "p", "c", mode="events", request_id="d1")
    assert (done.from_seq, done.to_seq, done.length) == (4, 7, 11)
    assert [f for f in record_fields(registry.redis, "c") if f.startswith(("plan:", "hold"))] == []


def test_what_a_run_that_died_holds_lapses_after_the_request_window(redis: Redis, clock: Clock) -> None:
    registry = Registry(redis, clock=clock, request_ttl=60)
    family(registry, "p", ["a", "b"])
    steps = registry.merges
    died = steps._run_of(merges.select_spec("p", ["a", "b"], "a", {"mode": "events", "request_id": "died"}))
    steps._many(steps._hold_ops(died))  # its holds taken; then the process died, never to run again
    code, message = code_of(lambda: merges.merge(registry, "p", "b", mode="events", request_id="early"))
    assert code is ErrorCode.ALREADY_MERGED and 'request "died"' in message
    clock.now += 61_000
    done = outcome_of(lambda: merges.merge(registry, "p", "b", mode="events", request_id="late"))
    assert isinstance(done, Merged) and done.child == "b" and states(registry, "a", "b") == ["live", "merged"]


def test_the_request_window_is_the_outcome_ttl(redis: Redis) -> None:
    settings = Settings(outcome_ttl=5, max_request_write_bytes=32 * 1024)
    state = Registry.from_settings(redis, settings).state
    assert (state.request_ttl, state.max_merge_bytes) == (5, 32 * 1024)


def test_two_thousand_merges_refused_at_the_parents_step_leave_the_childs_record_as_it_was(
        registry: Registry) -> None:
    family(registry, "p", ["c"])
    registry.append("p", [NewEvent("turn/start", {})])  # an open turn: each merge refused OPEN_TURN
    redis = registry.redis
    before = (record_fields(redis, "c"), redis.memory_usage(keys.session("c")))
    specs = [merges.merge_spec("p", "c", {"mode": "summary", "summary": i, "request_id": f"r{i}"}) for i in range(2000)]
    for at in range(0, 2000, 100):
        refused = merges.run_many(registry, specs[at:at + 100])
        assert {r.code for r in refused if isinstance(r, ForkError)} == {ErrorCode.OPEN_TURN} and len(refused) == 100
    assert (record_fields(redis, "c"), redis.memory_usage(keys.session("c"))) == before
    assert registry.state_of("c").state == "live"


# -- a select's lineage, an events merge's size ---------------------------------------------------------


def test_a_select_of_1024_candidates_1000_links_below_the_parent_checks_its_lineage_in_few_round_trips(
        registry: Registry) -> None:
    redis = registry.redis
    registry.append(registry.create("top"), turn(1))
    below = "top"
    for depth in range(1000):
        forks.fork(registry, below, f"d{depth}")
        below = f"d{depth}"
    candidates = [f"k{i}" for i in range(1024)]
    for at in range(0, 1024, 256):
        forks.fork_many(registry, below, candidates[at:at + 256])
    registry.append("k0", turn(2))
    redis.config_resetstat()
    started = time.monotonic()
    done = merges.select(registry, "top", candidates, "k0", mode="events", request_id="deep")
    took = time.monotonic() - started
    reads = redis.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)
    assert done.from_seq == 4 and len(done.abandoned) == 1023
    # Each session's record read a bounded number of times, not once per link per candidate: the
    # walk of one lineage serves every candidate that shares it.
    assert reads < 3 * (1024 + 1000), reads
    assert took < 10, took  # the job timeout is 30 s


def test_an_events_merge_is_bounded_by_the_request_write_limit(redis: Redis) -> None:
    registry = Registry.from_settings(redis, Settings(max_request_write_bytes=32 * 1024))
    family(registry, "p", ["c"])
    big = [NewEvent("assistant/message", {"text": "x" * 4000}) for _ in range(10)]
    registry.append("c", [NewEvent("turn/start", {}), *big, NewEvent("turn/end", {})])
    code, message = code_of(lambda: merges.merge(registry, "p", "c", mode="events", request_id="big"))
    assert code is ErrorCode.INVALID_BOUNDARY
    assert "32768 bytes" in message and "SESSIONFORK_MAX_REQUEST_WRITE_BYTES" in message
    assert registry.length("p") == 4 and registry.state_of("c").state == "live"
    assert [f for f in record_fields(redis, "c") if f.startswith("plan:")] == []
    done = merges.merge(registry, "p", "c", mode="events", range=(4, 7), request_id="small")
    assert (done.from_seq, done.to_seq) == (4, 7)


# -- the parent's step -------------------------------------------------------------------------------


def test_a_range_merged_before_is_already_merged_before_the_parents_guard_and_open_turn(
        registry: Registry) -> None:
    family(registry, "p", ["c", "s0", "s1"])
    merges.merge(registry, "p", "c", mode="events", request_id="m1")
    merges.select(registry, "p", ["s0", "s1"], "s0", mode="events", request_id="s1")
    registry.append("p", [NewEvent("turn/start", {})])  # open, and of another length than the guard's
    steps = registry.merges
    spec = merges.merge_spec("p", "c", {"mode": "events", "request_id": "m2", "if_parent_length": 3})
    reply = steps._many([steps._write_op(steps._run_of(spec), (4, 7, []), 4)])[0]
    assert [wire.text(x) for x in reply] == ["ALREADY", "c", "m1", "4"]
    select = merges.select_spec("p", ["s1", "c"], "c", {"mode": "events", "request_id": "s2", "if_parent_length": 3})
    assert isinstance(select, SelectSpec)
    reply = steps._many([steps._write_op(steps._run_of(select), (8, 11, []), 4)])[0]
    assert [wire.text(x) for x in reply] == ["ALREADY", "s1", "s1", ""]


def test_merged_events_carry_the_merges_time(redis: Redis, clock: Clock) -> None:
    registry = Registry(redis, clock=clock)
    family(registry, "p", ["c"])
    clock.now += 5_000
    merges.merge(registry, "p", "c", mode="events", request_id="t")
    log = registry.events("p")
    assert {e.time for e in log[4:]} == {clock.now}
    assert {e.time for e in registry.events("c")[4:]} == {clock.now - 5_000}


def test_a_child_merged_again_records_its_latest_merge(registry: Registry) -> None:
    family(registry, "p", ["c"])
    merges.merge(registry, "p", "c", mode="events", request_id="first")
    registry.append("c", turn(2))
    second = merges.merge(registry, "p", "c", mode="events", request_id="second")
    assert json.loads(registry.redis.hget(keys.session("c"), "mergedinto") or "") == ["p", second.first, "second"]
    merged_into = registry.state_of("c").merged_into
    assert merged_into is not None and (merged_into.seq, merged_into.request_id) == (second.first, "second")
