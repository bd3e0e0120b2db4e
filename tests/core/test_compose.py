"""Forks that schedulers compose, in the library against a real server: the ``if_length`` guard
(``PRECONDITION_FAILED``, its place in the error order), ``edits`` appended in the child's create
step (seqs, time, turn index, replays), and a variant fan-out (one snapshot, each child its own
edits). Through the queue: ``test_compose_queue``; a race against appends: ``test_compose_races``."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest
from fork_helpers import fork_error
from helpers import turn
from monitoring import monitored, script_runs
from redis import Redis

from sessionfork.core import forks, keys, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer

OPEN = [NewEvent("turn/start", {"turn": 9}), NewEvent("tool/call", {"id": "t1"})]
RETRY = [NewEvent("turn/start", {"turn": 2, "trigger": "user"}), NewEvent("user/message", {"text": "again"})]


@pytest.fixture
def src(registry: Registry) -> str:
    """Session "src": two finished turns (8 events)."""
    registry.append(registry.create("src", cwd="/w"), [*turn(1), *turn(2)])
    return "src"


def test_guard_forks_only_at_the_expected_length(registry: Registry, src: str) -> None:
    with fork_error(ErrorCode.PRECONDITION_FAILED, 'session "src" has 8 events, not 7'):
        forks.fork(registry, src, "c", if_length=7)
    assert not registry.exists("c")
    child = forks.fork(registry, src, "c", if_length=8)
    assert child.seed_length == 8
    with fork_error(ErrorCode.PRECONDITION_FAILED, 'session "src" has 8 events, not 0'):
        forks.snapshot(registry, src, if_length=0)
    assert forks.snapshot(registry, src, if_length=8, boundary=3)[1].seed_length == 4
    with fork_error(ErrorCode.PRECONDITION_FAILED, 'session "src" has 8 events, not 9'):
        forks.fork_many(registry, src, ["m1", "m2"], if_length=9)
    assert not registry.exists("m1") and not registry.exists("m2")


def test_guard_error_order(registry: Registry, src: str) -> None:
    """NOT_FOUND / NOT_LIVE, then PRECONDITION_FAILED, then SESSION_ALREADY_EXISTS, then the boundary."""
    registry.create("taken")
    with fork_error(ErrorCode.SESSION_NOT_FOUND, 'session "nope" not found'):
        forks.fork(registry, "nope", "taken", if_length=3, boundary=99)
    stale = wire.LiveHandle("src", "not-the-token")
    with fork_error(ErrorCode.SESSION_NOT_LIVE,
                    'live handle of session "src" is stale: its instance is not the live one'):
        forks.fork(registry, stale, "taken", if_length=3)
    with fork_error(ErrorCode.PRECONDITION_FAILED, 'session "src" has 8 events, not 3'):
        forks.fork(registry, src, "taken", if_length=3, boundary=99)
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "taken" already exists'):
        forks.fork(registry, src, "taken", if_length=8, boundary=99)
    with fork_error(ErrorCode.INVALID_BOUNDARY,
                    'cannot fork session "src" at boundary 99: past the end of a log of 8 events'):
        forks.fork(registry, src, "c", if_length=8, boundary=99)
    registry.append(src, OPEN)
    with fork_error(ErrorCode.PRECONDITION_FAILED, 'session "src" has 10 events, not 8'):
        forks.fork(registry, src, "c", if_length=8)
    with fork_error(ErrorCode.OPEN_TURN, 'cannot fork session "src" inside an open turn (last event: tool/call)'):
        forks.fork(registry, src, "c", if_length=10)


@pytest.mark.parametrize("value", [-1, True, 1.5, "8"])
def test_a_guard_that_is_not_a_length_is_invalid_request(registry: Registry, src: str, value: object) -> None:
    with pytest.raises(ForkError) as info:
        forks.fork(registry, src, "c", if_length=value)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_REQUEST and "ifLength" in info.value.message
    assert not registry.exists("c")


def test_edits_follow_the_seed_in_the_create_step(redis: Redis, registry: Registry, src: str) -> None:
    registry.state.clock = lambda: 1_234  # the fork's time
    child = forks.fork(registry, src, "c", boundary=3, edits=RETRY)
    assert (child.seed_length, child.created_at) == (4, 1_234)
    events = registry.events("c")
    assert registry.events("c", 0, 4) == registry.events(src, 0, 4)
    assert [(e.type, e.seq, e.time, e.data) for e in events[4:]] == [
        ("turn/start", 4, 1_234, {"turn": 2, "trigger": "user"}), ("user/message", 5, 1_234, {"text": "again"})]
    assert registry.length("c") == 6 and registry.header("c").seed_length == 4
    # The edits opened a turn: the plain rule sees it, a boundary inside it is refused, the seed end is fine.
    with fork_error(ErrorCode.OPEN_TURN, 'cannot fork session "c" inside an open turn (last event: user/message)'):
        forks.fork(registry, "c", "g")
    with fork_error(ErrorCode.INVALID_BOUNDARY,
                    'cannot fork session "c" at boundary 5: inside the turn opened at seq 4'):
        forks.fork(registry, "c", "g", boundary=5)
    assert registry.last_turn_end("c") == 3
    registry.append("c", [NewEvent("assistant/message", {"text": "ok"}), NewEvent("turn/end", {"turn": 2})])
    assert registry.last_turn_end("c") == 7
    grand = forks.fork(registry, "c", "g")
    assert grand.seed_length == 8
    assert [e.type for e in registry.events("g")][4:] == ["turn/start", "user/message", "assistant/message", "turn/end"]
    assert int(redis.hget(keys.session("src"), "len") or 0) == 8  # the source never sees them


def test_the_childs_edits_are_written_by_the_script_that_creates_it(server: EmbeddedServer, registry: Registry,
                                                                   src: str) -> None:
    """docs/guarantees.md, "Atomic steps, one slot each": a child is either fully there, edits
    included, or not at all. MONITOR shows every write to the child's keys inside one script, the
    record's and the edits' together: no reader can see the child without its edits."""
    child = {keys.session("c"), keys.session_log("c"), keys.session_turns("c")}
    with monitored(server) as seen:
        forks.fork(registry, src, "c", boundary=3, edits=RETRY)
    writing = [inner for _, inner in script_runs(seen) if any(c.writes(child) for c in inner)]
    assert len(writing) == 1, writing  # one script wrote the child: the record and its edits
    assert not [c for c in seen if c.client != "lua" and c.writes(child)]  # none outside a script
    (inner,) = writing
    record = [c for c in inner if c.name == "HSET" and c.args[1] == keys.session("c")]
    edits = [c for c in inner if c.name == "RPUSH" and c.args[1] == keys.session_log("c")]
    assert record and [len(c.args) - 2 for c in edits] == [len(RETRY)], inner
    assert registry.length("c") == 4 + len(RETRY)


def test_edits_that_close_a_turn_move_the_last_turn_end(registry: Registry, src: str) -> None:
    closed = [NewEvent("turn/start", {"turn": 3}), NewEvent("turn/end", {"turn": 3}), NewEvent("todo/write", {})]
    forks.fork(registry, src, "c", edits=closed)
    assert registry.last_turn_end("c") == 9
    assert forks.fork(registry, "c", "g", boundary=9).seed_length == 10
    with fork_error(ErrorCode.INVALID_BOUNDARY,
                    'cannot fork session "c" at boundary 8: inside the turn opened at seq 8'):
        forks.fork(registry, "c", "g2", boundary=8)


def test_a_replay_never_doubles_the_edits(registry: Registry, src: str) -> None:
    first = forks.fork(registry, src, "c", request_id="r1", edits=RETRY, if_length=8)
    registry.append(src, turn(3))  # the source moves on: the guard would fail now
    again = forks.fork(registry, src, "c", request_id="r1", edits=RETRY, if_length=8)
    assert again == first
    assert registry.length("c") == 10
    with fork_error(ErrorCode.SESSION_ALREADY_EXISTS, 'session "c" already exists'):
        forks.fork(registry, src, "c", edits=RETRY)


@pytest.mark.parametrize("edits", [
    [NewEvent("x", b"bytes")], [NewEvent("x", {1: 2})], [NewEvent("x", "y" * 2_000_000)],
    [NewEvent("ok"), NewEvent("x", {"d": "\ud800"})], [NewEvent("x", {"s": {1}})],
])
def test_edits_are_validated_as_append_validates(registry: Registry, src: str, edits: list[NewEvent]) -> None:
    with pytest.raises(ForkError) as info:
        forks.fork(registry, src, "c", edits=edits)
    with pytest.raises(ForkError) as appended:
        registry.append(src, edits)
    def text(err: ForkError) -> tuple[ErrorCode, str]:  # a size counts the time's digits: any size
        return err.code, re.sub(r"\d+ bytes", "N bytes", err.message)

    assert text(info.value) == text(appended.value)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert not registry.exists("c") and registry.length(src) == 8


@pytest.mark.parametrize(("edits", "words"), [
    ([NewEvent("x")] * 257, "expected 1 to 256 events, got 257"),
    ("turn/start", "sequence of NewEvent"),
    ([{"type": "x"}], "NewEvent objects"),
])
def test_edits_that_are_not_up_to_256_events_are_invalid(registry: Registry, src: str, edits: object,
                                                         words: str) -> None:
    with pytest.raises(ForkError) as info:
        forks.fork_many(registry, src, ["c"], edits=edits)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_REQUEST and words in info.value.message, info.value.message
    assert not registry.exists("c")


def test_variants_share_one_snapshot_each_with_its_own_edits(registry: Registry, src: str) -> None:
    prompts = {f"v{i}": [NewEvent("turn/start", {"turn": 3}), NewEvent("user/message", {"text": f"p{i}"})]
               for i in range(3)}
    prompts["v3"] = []  # a variant without edits: a plain child
    result = forks.fork_many(registry, src, list(prompts), edits=prompts, if_length=8)
    assert [h.id for h in result.created] == ["v0", "v1", "v2", "v3"] and not result.failed
    for i in range(3):
        assert registry.events(f"v{i}")[:8] == registry.events(src)
        assert [e.data for e in registry.events(f"v{i}")[8:]] == [{"turn": 3}, {"text": f"p{i}"}]
    assert registry.length("v3") == 8
    with pytest.raises(ForkError, match="edits name 'v9', which is not one of the child ids"):
        forks.fork_many(registry, src, ["w1"], edits={"v9": RETRY})
    assert not registry.exists("w1")


def test_deleting_the_parent_or_the_edited_child_keeps_every_byte_or_frees_every_key(
        redis: Redis, registry: Registry, src: str) -> None:
    forks.fork(registry, src, "c", boundary=3, edits=RETRY)
    before = [wire.event_to_builtins(e) for e in registry.events("c")]
    registry.delete(src)
    assert [wire.event_to_builtins(e) for e in registry.events("c")] == before
    registry.delete("c")
    left = {k.decode() for k in redis.keys("sf:s:*")}
    assert not any("{c}" in k and not k.endswith("}") for k in left if k != keys.session("c")), left
    assert not redis.exists(keys.session_log("c"), keys.session_turns("c"), keys.session_log(src))


def test_lineage_shows_each_childs_edits_count(registry: Registry, src: str) -> None:
    from sessionfork.ops import lineage, lineage_html

    forks.fork(registry, src, "edited", boundary=3, edits=RETRY)
    forks.fork(registry, src, "plain")
    tree = lineage.lineage(registry, src)
    assert [(n.id, n.seed_length, n.edits) for n in tree.root.children] == [
        ("edited", 4, 2), ("plain", 8, msgspec.UNSET)]
    text = lineage.render_text(tree)
    assert "edited  seed=4  edits=2  live" in text and "plain  seed=8  live" in text
    assert "-->|seed 4 + 2 edits|" in lineage.render_mermaid(tree)
    assert "seed 4 + 2 edits" in lineage_html.render_html(tree)
    assert lineage.lineage(registry, "edited").root.edits == 2
    assert '"edits":2' in wire.encode(tree).decode() and wire.encode(tree).decode().count('"edits"') == 1


def test_a_variant_fan_out_resumed_after_a_crash_gives_each_child_its_own_edits_once(
        redis: Redis, registry: Registry, src: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt dies after creating the first child; the source moves on (the guard
    would now fail); the retry creates the rest from the stored snapshot, each with its own edits,
    and the first child keeps its edits once."""
    from sessionfork.protocol.requests import Limits
    from sessionfork.worker.outcomes import Outcomes
    from sessionfork.worker.service import RequestService

    svc = RequestService(registry, Outcomes(redis, ttl=600, stream_maxlen=1000), reply_channel="sf:replies",
                      limits=Limits(max_fanout=16))
    step = registry.forks.child_step

    def dies_after_one(snap: Any, spec: Any, ids: Any = None) -> object:
        first = step(snap, spec, list(ids or spec.child_ids)[:1])  # its first child made, then it dies
        registry.forks.children_of(first, registry.forks.run_children([first])[0])
        raise RuntimeError("worker killed")

    payload = ('{"source": "src", "ifLength": 8, "variants": ['
               '{"sessionId": "v1", "edits": [{"type": "user/message", "data": 1}]}, {},'
               '{"sessionId": "v3", "edits": [{"type": "user/message", "data": 3}, {"type": "x"}]}]}')
    monkeypatch.setattr(registry.forks, "child_step", dies_after_one)
    with pytest.raises(RuntimeError):
        svc.handle(payload, "resume-1", final_attempt=False)
    monkeypatch.setattr(registry.forks, "child_step", step)
    assert registry.length("v1") == 9 and not registry.exists("v3")
    registry.append(src, turn(3))  # the source moves on: the stored snapshot still decides
    reply = svc.handle(payload, "resume-1", final_attempt=True)
    assert reply.ok and isinstance(reply, wire.ForkResult), reply
    ids = [h.id for h in reply.sessions or []]
    assert ids[0] == "v1" and ids[2] == "v3" and len(ids) == 3
    assert [registry.length(c) for c in ids] == [9, 8, 10]
    assert [e.data for e in registry.events("v3")[8:]] == [3, None]
    assert [e.data for e in registry.events("v1")[8:]] == [1]
