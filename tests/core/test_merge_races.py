"""Merges and selects racing on one real server: OS processes merging children into a
parent while another appends turns to it, event by event; two selects over the same candidates with
different winners; and, step by step, the interleavings a race can take (a select or a retry that
runs whole between another's reads and its parent's step).

The merge/append race is made certain: after each ``turn/start`` the appender waits until some merge
was refused ``OPEN_TURN`` (it met that open turn), after each ``turn/end`` until a merge turn lies
after it in the log; a merger, after each merge and each refusal, waits for the appender's next
append (so the children last the whole race, and no merger spins on an open turn)."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from typing import Any

import pytest
from clocks import Clock
from helpers import family
from racing import report_on, run, succeeded
from waits import outcome_of, wait_until

from sessionfork.core import merge_steps, merges
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.merge_steps import Merged
from sessionfork.core.registry import Registry
from sessionfork.core.specs import MergeSpec, SelectSpec
from sessionfork.core.wire import Event, NewEvent
from sessionfork.embedded import EmbeddedServer

TURNS = 4
MERGERS = 2
PER_MERGER = 4 * TURNS + 2  # a merger merges at most once per append, and once more
SELECT_ROUNDS = 6
WAIT = 60.0
APPENDS, REFUSED, OVER = "mrace:appends", "mrace:refused", "mrace:over"
"""Test keys (not sessionfork's): the appender's appends, the merges refused OPEN_TURN, the appender done."""


def above(redis: Any, counter: str, value: int) -> Callable[[], bool]:
    """Whether ``counter`` has passed ``value``."""
    return lambda: int(redis.get(counter) or 0) > value


def appended_since(redis: Any, value: int) -> Callable[[], bool]:
    """Whether the appender appended since its counter read ``value``, or is done."""
    return lambda: int(redis.get(APPENDS) or 0) > value or bool(redis.exists(OVER))


def longer(registry: Registry, length: int) -> Callable[[], bool]:
    """Whether the parent's log has more than ``length`` events."""
    return lambda: registry.length("p") > length


# -- worker bodies (module level, so that "spawn" children can import them) -------------------------


def _appender(port: int, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> list[int]:
        redis, seqs = registry.redis, []
        for n in range(TURNS):
            for event in (NewEvent("turn/start", {"n": n}), NewEvent("user/message", {"n": n}),
                          NewEvent("assistant/message", {"n": n}), NewEvent("turn/end", {"n": n})):
                refused = int(redis.get(REFUSED) or 0)
                (stored,) = registry.append("p", [event])
                seqs.append(stored.seq)
                redis.incr(APPENDS)
                if event.type == "turn/start":  # some merge meets this open turn
                    wait_until(above(redis, REFUSED, refused), WAIT, "a merge refused OPEN_TURN")
                elif event.type == "turn/end":  # some merge lands after it
                    wait_until(longer(registry, stored.seq + 1), WAIT, "a merge after a turn")
        redis.set(OVER, 1)
        return seqs

    report_on(port, "appender", gate, results, body)


def _merger(port: int, worker: int, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> dict[str, Any]:
        redis, done, refused = registry.redis, [], 0
        for i in range(PER_MERGER):
            child = f"c{worker}-{i}"
            while True:
                appended = int(redis.get(APPENDS) or 0)
                try:
                    merged = merges.merge(registry, "p", child, mode="events", request_id=f"race-{child}")
                except ForkError as exc:
                    if exc.code is not ErrorCode.OPEN_TURN:
                        raise
                    refused += 1
                    redis.incr(REFUSED)
                    wait_until(appended_since(redis, appended), WAIT, "the appender's next append")  # not a spin
                    continue
                done.append((child, merged.first))
                break
            wait_until(appended_since(redis, appended), WAIT, "the appender's next append")
        return {"merged": done, "refused": refused}

    report_on(port, f"merger-{worker}", gate, results, body)


def _selector(port: int, winner: int, gate: Any, results: Any) -> None:
    def body(registry: Registry) -> list[str]:
        out = []
        for r in range(SELECT_ROUNDS):
            try:
                merges.select(registry, f"q{r}", [f"q{r}-{i}" for i in range(3)], f"q{r}-{winner}", mode="summary",
                              summary={"winner": winner}, request_id=f"sel-{r}-{winner}")
            except ForkError as exc:
                out.append(exc.code.value)
            else:
                out.append("OK")
        return out

    report_on(port, f"selector-{winner}", gate, results, body)


# -- helpers ---------------------------------------------------------------------------------------


def child_step(registry: Registry, spec: MergeSpec | SelectSpec) -> tuple[Any, tuple[int, int, list[bytes]]]:
    """A merge's (a select's) child step alone (``merge_read``, its holds), as ``MergeSteps.run_many``
    runs it: the run and what it read."""
    steps = registry.merges
    run = steps._run_of(spec)
    return run, merge_steps._read_result(run.merge, steps._many(steps._hold_ops(run))[0])


def parent_step(registry: Registry, run: Any, read: tuple[int, int, list[bytes]], forked_at: int) -> Merged:
    """A merge's parent step alone (``merge``), from its child step's ``read``."""
    steps = registry.merges
    reply = steps._many([steps._write_op(run, read, forked_at)])[0]
    return steps._write_result(run, read[:2], reply)


def segments(log: list[Event]) -> list[tuple[str, Any]]:
    """The parent's log after its first turn, cut into merge turns ``("merge", child)`` and single
    other events ``("event", type)``; a merge turn must be whole: its ``turn/start``, its
    ``session/merge``, the child's four events with their provenance, its ``turn/end``."""
    out: list[tuple[str, Any]] = []
    i = 4
    while i < len(log):
        event = log[i]
        if event.type == "turn/start" and event.data == {"trigger": "merge"}:
            meta = log[i + 1]
            assert meta.type == "session/merge", (i, meta)
            child = meta.data["mergedFrom"]["session"]
            assert meta.data["mergedFrom"] == {"session": child, "fromSeq": 4, "toSeq": 7}, meta
            body = log[i + 2:i + 6]
            sources = [{"session": child, "seq": s} for s in range(4, 8)]
            assert [e.extra.get("source") for e in body] == sources, (i, body)
            assert (log[i + 6].type, log[i + 6].data) == ("turn/end", {"reason": "merged"}), (i, log[i + 6])
            out.append(("merge", child))
            i += 7
        else:
            assert "source" not in event.extra, (i, event)  # an append, never a merged event outside its turn
            out.append(("event", event.type))
            i += 1
    return out


# -- the races: run once, in one set of processes (spawning them is most of the cost) ---------------


@dataclass(frozen=True)
class Raced:
    """What the racing processes reported, and what the server held right after."""

    error: str | None
    """Why the race itself failed (a process crashed, a wait ran out), asserted by each test."""
    results: dict[str, tuple[str, Any]]
    children: list[str]
    log: list[Event]
    states: dict[str, str]
    select_logs: list[list[Event]]


@pytest.fixture(scope="module")
def raced(server: EmbeddedServer) -> Iterator[Raced]:
    """The merge/append race (an appender, ``MERGERS`` mergers) and the select race (two selectors,
    ``SELECT_ROUNDS`` parents of three candidates each, winners 0 and 1), run together."""
    ctx = multiprocessing.get_context("spawn")
    spawned: list[SpawnProcess] = []
    with server.client() as redis:
        redis.flushall()
        registry = Registry(redis)
        children = [f"c{w}-{i}" for w in range(MERGERS) for i in range(PER_MERGER)]
        family(registry, "p", children)
        candidates = [f"q{r}-{i}" for r in range(SELECT_ROUNDS) for i in range(3)]
        for r in range(SELECT_ROUNDS):
            family(registry, f"q{r}", [f"q{r}-{i}" for i in range(3)])
        jobs: list[tuple[Callable[..., None], tuple[Any, ...]]] = [(_appender, (server.port,))]
        jobs += [(_merger, (server.port, w)) for w in range(MERGERS)]
        jobs += [(_selector, (server.port, w)) for w in (0, 1)]
        results: dict[str, tuple[str, Any]] = {}
        error = None
        try:
            results = run(ctx, spawned, jobs)
        except (AssertionError, pytest.fail.Exception) as exc:  # the tests' verdict, in their call phase
            error = str(exc)
        finally:
            for process in spawned:
                if process.is_alive():
                    process.kill()
                process.join(WAIT)
        yield Raced(error=error, results=results, children=children, log=registry.events("p"),
                    states={sid: registry.state_of(sid).state for sid in children + candidates},
                    select_logs=[registry.events(f"q{r}") for r in range(SELECT_ROUNDS)])


def test_merges_racing_appends_land_between_whole_turns_each_once(raced: Raced) -> None:
    assert raced.error is None, raced.error
    (seqs,) = succeeded(raced.results, "appender")
    reports = succeeded(raced.results, *(f"merger-{w}" for w in range(MERGERS)))
    assert sum(r["refused"] for r in reports) > 0  # it raced: merges met the appender's open turns
    log, children = raced.log, raced.children
    cut = segments(log)
    merged = [who for kind, who in cut if kind == "merge"]
    assert Counter(merged) == dict.fromkeys(children, 1)  # each child's range merged exactly once
    # The appends, in order and whole: every appended turn is four events in a row, no merge inside.
    appended = [what for kind, what in cut if kind == "event"]
    assert appended == ["turn/start", "user/message", "assistant/message", "turn/end"] * TURNS
    assert [(log[s].type, log[s].data["n"]) for s in seqs] == [(t, n) for n in range(TURNS) for t in appended[:4]]
    kinds = [kind for kind, _ in cut]
    first_append, last_append = kinds.index("event"), len(kinds) - 1 - kinds[::-1].index("event")
    assert "merge" in kinds[first_append:last_append]  # it raced: merges landed between appends
    firsts = {child: first for r in reports for child, first in r["merged"]}
    assert {child: log[first].data for child, first in firsts.items()} == {c: {"trigger": "merge"} for c in children}
    assert {raced.states[c] for c in children} == {"merged"}


def test_two_selects_over_the_same_candidates_one_wins_the_other_is_already_merged(raced: Raced) -> None:
    assert raced.error is None, raced.error
    first, second = succeeded(raced.results, "selector-0", "selector-1")
    for r in range(SELECT_ROUNDS):
        assert sorted([first[r], second[r]]) == ["ALREADY_MERGED", "OK"], (r, first[r], second[r])
        winner = 0 if first[r] == "OK" else 1
        assert [raced.states[f"q{r}-{i}"] for i in range(3)] == [
            "merged" if i == winner else "abandoned" for i in range(3)]
        log = raced.select_logs[r]
        assert len(log) == 8 and log[6].data == {"summary": {"winner": winner},
                                                 "summarizes": {"session": f"q{r}-{winner}", "fromSeq": 4, "toSeq": 7}}


# -- the interleavings, step by step ---------------------------------------------------------------


def test_a_select_that_ran_whole_between_anothers_reads_and_its_parent_step_makes_it_already_merged(
        redis: Any, clock: Clock) -> None:
    """The parent's step notes a select's candidates: a select whose holds on them lapsed (its
    run stalled past the request window) while another select ran whole over them is refused
    there, nothing written. (Within the window the holds decide: ``test_merge_holds``.)"""
    registry = Registry(redis, clock=clock, request_ttl=60)
    family(registry, "q", ["a", "b", "c"])
    late = merges.select_spec("q", ["a", "b", "c"], "a", {"mode": "events", "request_id": "late"})
    run, read = child_step(registry, late)  # the late select read its winner, held all candidates
    clock.now += 61_000
    merges.select(registry, "q", ["a", "b", "c"], "b", mode="events", request_id="early")
    with pytest.raises(ForkError) as info:
        parent_step(registry, run, read, 4)
    assert info.value.code is ErrorCode.ALREADY_MERGED
    assert 'by request "early"' in info.value.message
    assert registry.length("q") == 11 and [registry.state_of(s).state for s in "abc"] == [
        "abandoned", "merged", "abandoned"]


def test_a_merge_into_the_same_parent_between_a_selects_reads_and_its_step_leaves_the_select_whole(
        registry: Registry) -> None:
    """A select's candidates noted in the parent's step, not before: another child merged meanwhile
    moves the parent on, and the select still merges its winner once, as one turn after it."""
    family(registry, "q", ["a", "b", "other"])
    spec = merges.select_spec("q", ["a", "b"], "a", {"mode": "events", "request_id": "sel"})
    assert isinstance(spec, SelectSpec)
    run, read = child_step(registry, spec)
    merges.merge(registry, "q", "other", mode="events")
    done = outcome_of(lambda: parent_step(registry, run, read, 4))
    assert isinstance(done, Merged) and (done.first, done.length) == (11, 18)
    assert [kind for kind, _ in segments(registry.events("q"))] == ["merge", "merge"]


def test_a_retry_that_ran_whole_between_the_first_runs_reads_and_its_parent_step_answers_the_first_merge(
        registry: Registry) -> None:
    """A worker that read no merge under its request id, then stalled while a second worker ran the
    same request whole (the job deemed abandoned): its parent step answers that merge, writes nothing."""
    family(registry, "p", ["c"])
    spec = merges.merge_spec("p", "c", {"mode": "events", "request_id": "twice"})
    run, read = child_step(registry, spec)  # the first run's child step: nothing merged yet
    first = merges.merge(registry, "p", "c", mode="events", request_id="twice")
    assert outcome_of(lambda: parent_step(registry, run, read, 4)) == first
    assert registry.length("p") == 11 and [kind for kind, _ in segments(registry.events("p"))] == ["merge"]


def test_a_batchs_parent_steps_go_in_order_whatever_the_servers_script_cache(registry: Registry) -> None:
    """A batch's parents' steps are sent as ``EVAL`` of their text (``lua.eval_many(in_order=True)``):
    never NOSCRIPT, so none is re-run after the steps that followed it (another client loading the
    script in between would have let the second merge into a parent land first)."""
    family(registry, "po", ["a", "b"])
    redis = registry.redis
    redis.script_flush()
    redis.config_resetstat()
    first = merges.merge_spec("po", "a", {"mode": "events", "request_id": "po-1"})
    second = merges.merge_spec("po", "b", {"mode": "events", "request_id": "po-2", "if_parent_length": 11})
    done = merges.run_many(registry, [first, second])
    assert [(m.first, m.length) if isinstance(m, Merged) else m for m in done] == [(4, 11), (11, 18)]
    stats = redis.info("commandstats")
    assert stats.get("cmdstat_eval", {}).get("calls", 0) == 2  # the two parents' steps, each with its text
