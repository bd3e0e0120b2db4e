"""Deletion and retention keep a summary child's kept range and free what only the summarised part
needed, on one real server and on the 3-master cluster: the needs index records
where each summary child starts reading its parent; a deleted, pinned session's own-log prefix that
no descendant reads becomes placeholders (positions never move), and a session whose descendants
read none of its seed is unpinned from its parent. Not one byte of any descendant changes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import turn
from waits import raised

import sessionfork
from sessionfork.core import forks, keys
from sessionfork.core.deletion import Deleter
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.factories import now_ms
from sessionfork.core.registry import Registry
from sessionfork.core.retention import sweep
from sessionfork.core.wire import NewEvent
from sessionfork.ops import diff
from sessionfork.ops.persist import JsonlBackend

S = sessionfork.Summary
BIG = "x" * 1000  # large events: the freed prefix dominates the log's memory


@pytest.fixture(params=["one-server", "cluster"])
def reg(request: pytest.FixtureRequest) -> Registry:
    name = "registry" if request.param == "one-server" else "cluster_registry"
    registry: Registry = request.getfixturevalue(name)
    return registry


def big_turn(n: int) -> list[NewEvent]:
    return [NewEvent(e.type, {**e.data, "blob": BIG}) for e in turn(n)]


def source(registry: Registry, sid: str, turns: int, first: int = 1) -> str:
    registry.append(registry.create(sid, cwd="/w"), [e for n in range(first, first + turns) for e in big_turn(n)])
    return sid


def raw(registry: Registry, sid: str) -> tuple[Any, ...]:
    """Every byte of a session's record, own log, turn index and children/needs indexes."""
    r = registry.redis
    return (r.hgetall(keys.session(sid)), r.lrange(keys.session_log(sid), 0, -1),
            r.lrange(keys.session_turns(sid), 0, -1), r.smembers(keys.session_children(sid)),
            r.zrange(keys.session_needs(sid), 0, -1, withscores=True))


def log_bytes(registry: Registry, sid: str) -> int:
    return int(registry.redis.memory_usage(keys.session_log(sid), samples=0) or 0)


def freed(registry: Registry, sid: str) -> int:
    return int(registry.redis.hget(keys.session(sid), "freed") or 0)


def gone_for_good(registry: Registry, sid: str) -> bool:
    r = registry.redis
    return (set(r.hkeys(keys.session(sid))) == {b"deleted"} and not r.exists(keys.session_log(sid))
            and not r.exists(keys.session_needs(sid)) and not r.exists(keys.session_children(sid)))


def boundary_answers(registry: Registry, sid: str) -> list[Any]:
    """What the source step answers for every boundary and every keepFrom of ``sid`` (nothing created)."""
    out: list[Any] = []
    for b in range(registry.length(sid)):
        try:
            snap = registry.take_snapshot(sid, b)
            out.append((snap.length, snap.seed_end, snap.last))
        except ForkError as exc:
            out.append(exc.message)
    whole = registry.take_snapshot(sid)
    for k in range(1, whole.length + 1):
        try:
            registry.check_keep_from(whole, k)
            out.append(("keep", k))
        except ForkError as exc:
            out.append(exc.message)
    return out


def test_deleting_the_source_frees_all_but_the_kept_range(reg: Registry, tmp_path: Path) -> None:
    src = source(reg, "src", 50)  # 200 events of ~1 KB
    forks.fork(reg, src, "c", summary=S(keep_from=196, data="49 turns"))  # keeps the last turn
    assert reg.redis.zscore(keys.session_needs(src), "c") == 196
    forks.fork(reg, "c", "g", boundary=2 + 2)  # a descendant of the summary child, own events too
    reg.append("g", turn(60))
    before = {sid: (raw(reg, sid), Registry(reg.redis).events(sid)) for sid in ("c", "g")}
    answers = boundary_answers(reg, "c")
    full, length = log_bytes(reg, src), reg.redis.llen(keys.session_log(src))
    reg.delete(src)
    assert log_bytes(reg, src) < full // 10, (log_bytes(reg, src), full)  # the summarised part is freed
    assert reg.redis.llen(keys.session_log(src)) == length and freed(reg, src) == 196  # positions kept
    fresh = Registry(reg.redis)
    for sid in ("c", "g"):
        assert (raw(reg, sid), fresh.events(sid)) == before[sid]  # not one byte changed
    assert boundary_answers(fresh, "c") == answers
    # A fork of every kind of the summary child still works, and reads the kept events.
    assert fresh.events(forks.fork(fresh, "c", "p").id) == before["c"][1]
    assert fresh.events(forks.fork(fresh, "c", "b", boundary=4).id) == before["c"][1][:5]
    s2 = forks.fork(fresh, "c", "s2", summary=S(keep_from=1, data="again")).id
    assert [e.data for e in fresh.events(s2)[1:]] == [e.data for e in before["c"][1][1:]]
    assert diff.diff(fresh, "c", "g").shared == 5
    assert JsonlBackend(fresh, tmp_path, consumer="c1", block_ms=10).sync("c") == 5
    for sid in ("c", "g", "p", "b", s2):
        reg.delete(sid)
    assert gone_for_good(reg, src) and gone_for_good(reg, "c")


def test_a_plain_child_holds_the_whole_log_until_it_goes(reg: Registry) -> None:
    src = source(reg, "src", 10)
    forks.fork(reg, src, "plain")
    forks.fork(reg, src, "c", summary=S(keep_from=36, data="s"))
    kept = reg.events("c")
    full = log_bytes(reg, src)
    reg.delete(src)
    assert freed(reg, src) == 0 and log_bytes(reg, src) == full  # "plain" reads it all
    reg.delete("plain")
    assert freed(reg, src) == 36 and log_bytes(reg, src) < full // 5
    assert Registry(reg.redis).events("c") == kept


def test_a_fan_out_of_summary_children_frees_up_to_the_least_need(reg: Registry) -> None:
    src = source(reg, "src", 10)
    for cid, k in (("k8", 8), ("k20", 20), ("k36", 36)):
        forks.fork(reg, src, cid, summary=S(keep_from=k, data=cid))
    logs = {cid: reg.events(cid) for cid in ("k8", "k20", "k36")}
    reg.delete(src)
    assert freed(reg, src) == 8  # the least need wins
    reg.delete("k8")
    assert freed(reg, src) == 20
    reg.delete("k20")
    assert freed(reg, src) == 36
    assert Registry(reg.redis).events("k36") == logs["k36"]
    reg.delete("k36")
    assert gone_for_good(reg, src)


def test_a_reader_that_a_deletion_overtook_gets_not_found_never_a_placeholder(reg: Registry) -> None:
    """A reader that knows a summary child's lineage (cached at its first read) reads it again
    after it was deleted and its source's prefix freed: the slice it reads holds placeholders,
    and the answer is SESSION_NOT_FOUND, as for any session deleted meanwhile (found by CI: the
    placeholders reached the event decoder first, "Input data was truncated")."""
    src = source(reg, "src", 10)
    for cid, k in (("k8", 8), ("k20", 20)):
        forks.fork(reg, src, cid, summary=S(keep_from=k, data=cid))
    reader = Registry(reg.redis)
    kept = reader.events("k8")
    reg.delete(src)
    reg.delete("k8")
    assert freed(reg, src) == 20  # k8's slice of src starts at 8: 12 of its events are placeholders
    assert reg.redis.lrange(keys.session_log(src), 8, 8) == [b""]
    caught = raised(lambda: reader.events("k8"))
    assert isinstance(caught, ForkError) and caught.code is ErrorCode.SESSION_NOT_FOUND, repr(caught)
    assert len(kept) == 1 + 40 - 8 and Registry(reg.redis).events("k20") == reader.events("k20")


def read_around(monkeypatch: pytest.MonkeyPatch, registry: Registry, sid: str, early: set[int],
                deletion: Callable[[], object]) -> tuple[list[list[Any]], Exception]:
    """Read ``sid`` (its lineage cached), run ``deletion``, read it again with the answers at
    positions ``early`` of its pipeline (the record's node, say) taken from the first read, as if
    they were answered before the deletion: a cluster's unordered answers, forced. Returns both
    reads' real answers and what the second read raised (whatever it is: the caller asserts it)."""
    pipeline = type(registry.redis.pipeline())
    real = pipeline.execute
    answers: list[list[Any]] = []

    def interleaved(pipe: Any, *args: Any, **kwargs: Any) -> Any:
        answers.append(real(pipe, *args, **kwargs))
        n = len(answers[-1])
        return [answers[0 if i in early or i - n in early else -1][i] for i in range(n)]

    reader = Registry(registry.redis)
    with monkeypatch.context() as patched:
        patched.setattr(pipeline, "execute", interleaved)
        reader.events(sid)
    deletion()
    with monkeypatch.context() as patched:
        patched.setattr(pipeline, "execute", interleaved)
        caught = raised(lambda: reader.events(sid))
    return answers, caught


def test_a_placeholder_read_after_the_record_answered_is_not_found(registry: Registry,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On a cluster, the node holding a summary child's record can answer (its summary, "still
    there") before the child's deletion while the node holding its source's log answers after the
    freeing: the placeholders alone tell, and the record is asked again (gone: SESSION_NOT_FOUND)."""
    src = source(registry, "src", 10)
    for cid, k in (("k8", 8), ("k20", 20)):
        forks.fork(registry, src, cid, summary=S(keep_from=k, data=cid))
    answers, caught = read_around(monkeypatch, registry, "k8", {0, -1},  # [summary, src's slice, own log, there]
                                  lambda: (registry.delete(src), registry.delete("k8")))
    assert isinstance(caught, ForkError) and caught.code is ErrorCode.SESSION_NOT_FOUND, repr(caught)
    before, after = answers
    assert before[0] is not None and before[-1] and after[0] is None and not after[-1]  # the forced order
    assert len(after[1]) == len(before[1]) == 40 - 8 and after[1][0] == b""  # full length, placeholders


def test_an_own_log_read_after_the_record_answered_is_not_found(registry: Registry,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster pipeline sends a command again after a MOVED or ASK, behind the rest: the own
    log's read can come after the "still there?" of its record, across a deletion that freed
    the log's prefix. The placeholder tells there too."""
    source(registry, "src", 3)
    forks.fork(registry, "src", "c")
    registry.append("c", [e for n in range(4, 9) for e in big_turn(n)])  # c's own events: seqs 12-31
    forks.fork(registry, "c", "g", summary=S(keep_from=24, data="keeps c's last two turns"))
    answers, caught = read_around(monkeypatch, registry, "c", {-1},  # [src's slice, own log, there]
                                  lambda: registry.delete("c"))
    assert isinstance(caught, ForkError) and caught.code is ErrorCode.SESSION_NOT_FOUND, repr(caught)
    before, after = answers
    assert freed(registry, "c") == 12 and before[-1] and not after[-1]  # the forced order
    assert len(after[1]) == len(before[1]) == 20 and after[1][0] == b"" and after[1][12] == before[1][12]


def test_a_summary_child_of_a_summary_child_frees_its_source_in_steps(reg: Registry) -> None:
    src = source(reg, "src", 5)  # 20 events
    forks.fork(reg, src, "c", summary=S(keep_from=12, data="three turns"))  # c: summary + turns 4-5 = 9
    reg.append("c", [e for n in (6, 7) for e in big_turn(n)])  # c's own events: seqs 9-16
    forks.fork(reg, "c", "low", summary=S(keep_from=5, data="reads c's seed"))  # 5 < c's seedlen 9
    forks.fork(reg, "c", "g", summary=S(keep_from=13, data="keeps turn 7"))  # 13 >= 9: c's own events
    logs = {sid: reg.events(sid) for sid in ("low", "g")}
    answers = boundary_answers(reg, "low")
    reg.delete(src)
    assert freed(reg, src) == 12
    reg.delete("c")
    # "low" reads c's seqs 5-8, which are src's 16-19: c's need in src is raised to 16.
    assert freed(reg, "c") == 0 and reg.redis.zscore(keys.session_needs(src), "c") == 16
    assert freed(reg, src) == 16 and not reg.redis.hexists(keys.session("c"), "summary")
    assert Registry(reg.redis).events("low") == logs["low"] and boundary_answers(reg, "low") == answers
    reg.delete("low")
    assert freed(reg, "c") == 4  # c's own-log positions for its seqs 9-12: turn 6
    assert gone_for_good(reg, src)  # c reads nothing of src now: unpinned, and src had no other pin
    assert reg.redis.smembers(keys.session_children("c")) == {b"g"}
    assert Registry(reg.redis).events("g") == logs["g"]
    assert Registry(reg.redis).events(forks.fork(reg, "g", "gg", boundary=4).id) == logs["g"][:5]


def test_a_deleted_grandparent_frees_what_its_grandchildren_do_not_read(reg: Registry) -> None:
    gp = source(reg, "gp", 3)
    forks.fork(reg, gp, "mid")  # a plain child: reads all of gp
    reg.append("mid", [e for n in (4, 5) for e in big_turn(n)])  # mid: seedlen 12, events 12-19
    forks.fork(reg, "mid", "c8", summary=S(keep_from=8, data="reads gp's turn 3"))
    forks.fork(reg, "mid", "c16", summary=S(keep_from=16, data="reads mid's turn 5"))
    logs = {sid: reg.events(sid) for sid in ("c8", "c16")}
    reg.delete(gp)
    assert freed(reg, gp) == 0 and reg.redis.sismember(keys.session_children(gp), "mid")
    reg.delete("mid")
    assert freed(reg, "mid") == 0 and freed(reg, gp) == 8  # mid's need in gp raised to 8
    assert Registry(reg.redis).events("c8") == logs["c8"]
    reg.delete("c8")
    assert freed(reg, "mid") == 4 and gone_for_good(reg, gp)
    assert Registry(reg.redis).events("c16") == logs["c16"]


def readable(registry: Registry, sid: str) -> list[Any] | str:
    """``sid``'s events as a fresh registry reads them, or the error it raises instead (a log
    freed under a descendant is a ``RuntimeError`` of the reader's consistency check)."""
    try:
        return list(Registry(registry.redis).events(sid))
    except (ForkError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"


def test_a_deleted_session_stays_pinned_while_a_descendant_reads_its_last_seed_event(reg: Registry) -> None:
    """docs/guarantees.md, "Deletion keeps a summary child's kept range, and only that" (not one
    byte of a descendant changes): G -> M -> S, S a summary child of M from M's last seed event
    (``keepFrom`` = M's seedLength - 1, an event of G's log). Deleting M keeps it pinned in G from
    that event on; deleting G then frees the rest of G, and S reads every event as before."""
    g = source(reg, "g", 3)  # 12 events
    reg.append(g, [NewEvent("todo/write", {"t": 1})])  # seq 12: outside any turn, after a turn/end
    m = forks.fork(reg, g, "m", boundary=12)  # seedLength 13: m's last seed event is g's todo
    reg.append("m", [e for n in (4, 5) for e in big_turn(n)])  # m's own events: seqs 13-20
    forks.fork(reg, "m", "s", summary=S(keep_from=m.seed_length - 1, data="turns 1-3"))
    before = readable(reg, "s")
    assert isinstance(before, list) and [e.type for e in before[:2]] == ["session/summary", "todo/write"]
    reg.delete("m")
    reg.delete(g)
    assert readable(reg, "s") == before
    assert reg.redis.zscore(keys.session_needs(g), "m") == 12  # m pinned in g from the todo on
    assert freed(reg, g) == 12  # what s does not read is freed, the todo is not
    reg.delete("s")
    assert gone_for_good(reg, g) and gone_for_good(reg, "m")


def test_a_kept_range_after_a_gap_between_turns_keeps_its_boundary_answers(reg: Registry) -> None:
    """The kept range starts with an event outside any turn: its boundary checks find the turn/end
    before it, which the freeing keeps (the last marker before what descendants read)."""
    src = source(reg, "src", 3)
    reg.append(src, [NewEvent("todo/write", {"t": 1}), *big_turn(4)])
    forks.fork(reg, src, "c", summary=S(keep_from=12, data="s"))  # c's seq 1 is the first todo
    answers = boundary_answers(reg, "c")
    reg.delete(src)
    assert freed(reg, src) == 12 and reg.redis.llen(keys.session_turns(src)) == 3
    assert boundary_answers(reg, "c") == answers


def test_retention_frees_the_summarised_part(reg: Registry) -> None:
    src = source(reg, "src", 10)
    forks.fork(reg, src, "c", summary=S(keep_from=36, data="s"))
    kept = reg.events("c")
    reg.dispose(src)
    full = log_bytes(reg, src)
    (swept,) = sweep(reg, now_ms=now_ms() + 1, older_than_ms=0)
    assert swept.id == src and swept.log_kept and swept.bytes > (full - log_bytes(reg, src)) * 0.9
    assert freed(reg, src) == 36 and log_bytes(reg, src) < full // 5
    assert Registry(reg.redis).events("c") == kept


def test_children_indexed_before_needs_existed_keep_the_whole_log(reg: Registry) -> None:
    src = source(reg, "src", 10)
    forks.fork(reg, src, "c", summary=S(keep_from=36, data="s"))
    reg.redis.zrem(keys.session_needs(src), "c")  # the layout of a child indexed by the previous version
    kept, full = reg.events("c"), log_bytes(reg, src)
    reg.delete(src)
    assert freed(reg, src) == 0 and log_bytes(reg, src) == full  # conservative: it may read from 0
    assert Registry(reg.redis).events("c") == kept


def test_freeing_is_idempotent_and_a_killed_step_is_resumed(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    src = source(reg, "src", 10)
    forks.fork(reg, src, "a", summary=S(keep_from=8, data="a"))
    forks.fork(reg, src, "b", summary=S(keep_from=20, data="b"))
    logs = {cid: reg.events(cid) for cid in ("a", "b")}
    with monkeypatch.context() as m:  # killed right after delete.lua: no release step ran
        m.setattr(Deleter, "release", lambda self, parent, child: None)
        reg.delete(src)
    assert freed(reg, src) == 0  # pinned longer than needed: memory, never data
    reg.delete("a")  # the next release in the lineage resumes it
    assert freed(reg, src) == 20
    state = raw(reg, src)
    reg.deletion.release(src, "")  # a step run again changes nothing
    reg.deletion.release(src, "a")
    reg.deletion.release(src, "stranger", "30")  # a late raise for a child unpinned meanwhile: no entry
    assert raw(reg, src) == state and Registry(reg.redis).events("b") == logs["b"]


def test_a_pin_keeps_the_least_need_of_its_attempts(cluster_registry: Registry) -> None:
    """On a cluster the pin comes before the child: an attempt that pinned an id and never created
    it must not leave a need above what the child that takes the id reads."""
    reg = cluster_registry
    src = source(reg, "src", 10)
    reg.state.scripts("pin", record=keys.session(src), children=keys.session_children(src),
                      needs=keys.session_needs(src), need=36, child_ids=["c", "p"])  # a crashed attempt
    forks.fork(reg, src, "c", summary=S(keep_from=8, data="s"))
    forks.fork(reg, src, "p")
    assert reg.redis.zrange(keys.session_needs(src), 0, -1, withscores=True) == [(b"c", 8.0)]
    kept = reg.events("c")
    reg.delete("p")
    reg.delete(src)
    assert freed(reg, src) == 8 and Registry(reg.redis).events("c") == kept


def test_a_tombstone_of_the_previous_version_raises_no_need_beyond_what_is_read(
        reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """A summary child deleted by the previous version keeps no ``keptfrom``: what its descendants
    read is mapped to its parent's seqs as a plain child's (lower: conservative), never higher."""
    src = source(reg, "src", 5)
    forks.fork(reg, src, "c", summary=S(keep_from=12, data="three turns"))  # c's seqs 1-8: src's 12-19
    reg.append("c", big_turn(6))
    for cid, k in (("low", 5), ("x", 9)):
        forks.fork(reg, "c", cid, summary=S(keep_from=k, data=cid))
    log = reg.events("low")
    reg.delete(src)
    with monkeypatch.context() as m:  # deleted as the previous version did: no freeing step
        m.setattr(Deleter, "release", lambda self, parent, child: None)
        reg.delete("c")
    reg.redis.hdel(keys.session("c"), "keptfrom")
    reg.delete("x")  # c's least need is now 5: 16 in src's seqs, but without keptfrom it says 5
    assert reg.redis.zscore(keys.session_needs(src), "c") == 12 and freed(reg, src) == 12
    assert Registry(reg.redis).events("low") == log
