"""What a fan-out's child step does per child, counted.

A fan-out's children share one seed and one source, so what they share is built once: the create
script's call is built once for all of them (its names checked and its shared arguments placed
once), and the script answers ``CREATED`` for a record it made now rather than rebuilding the
header's wire JSON that the caller sent it. Counted, not timed: ``python -m bench.ab COMMIT``
measures the rate against an older commit.
"""

from __future__ import annotations

from typing import Any

import pytest
from fork_helpers import turn
from redis import Redis

from sessionfork.core import forks, keys, lua, wire
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.fork_steps import MANY
from sessionfork.core.registry import CREATED, Registry
from sessionfork.core.wire import NewEvent


def counted_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the scripts whose calls are built from now on (``lua.Spec.build``)."""
    built: list[str] = []
    build = lua.Spec.build

    def counted(spec: lua.Spec, named: Any) -> Any:
        built.append(spec.name)
        return build(spec, named)

    monkeypatch.setattr(lua.Spec, "build", counted)
    return built


def command_calls(redis: Redis) -> dict[str, int]:
    """The server's calls so far of each command (``INFO commandstats``)."""
    return {k: int(v["calls"]) for k, v in redis.info("commandstats").items()}


def test_a_fan_out_on_one_server_creates_its_children_in_calls_of_many(
        redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """One ``create_many`` call per ``MANY`` children (one parent check, one index write each),
    which answers each child as ``create`` would: the children are the same as one call each."""
    registry = Registry(redis, clock=lambda: 1_700_000_000_000)
    registry.append(registry.create("src", cwd="/w"), turn())
    built = counted_builds(monkeypatch)
    assert MANY == 64  # documented: up to 64 children a call
    ids = [f"c{i}" for i in range(130)]  # 64 + 64 + 2
    result = forks.fork_many(registry, "src", ids)
    assert [h.id for h in result.created] == ids and not result.failed
    assert built.count("create_many") == 3 and "create" not in built, built
    assert set(registry.children("src")) == set(ids)
    single = forks.fork_many(registry, "src", ["alone"])  # one child: a create call of its own
    assert registry.events("alone") == registry.events(ids[-1]) == registry.events("src")
    stored = [redis.hgetall(keys.session(c)) for c in ("alone", ids[0], ids[-1])]
    for record in stored:  # every field alike but the instance token, the id being the key's
        record.pop(b"instance")
    assert stored[0] == stored[1] == stored[2]
    assert single.created[0].parent_session == "src"


def test_children_with_edits_of_their_own_ride_the_same_call_stored_as_alone(
        redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Children with edits of their own (a variant fan-out) are created in the same ``create_many``
    call as the plain ones, in their places: each record, log and turn index as ``create`` stores
    them for a one-child fork with the same edits."""
    registry = Registry(redis, clock=lambda: 1_700_000_000_000)
    registry.append(registry.create("src"), turn())
    closing = [NewEvent("turn/start"), NewEvent("user/message", {"text": "x"}), NewEvent("turn/end")]
    opening = [NewEvent("user/message", {"text": "y"})]
    built = counted_builds(monkeypatch)
    ids = ["a", "b", "c", "d", "e"]
    result = forks.fork_many(registry, "src", ids, edits={"c": closing, "e": opening})
    assert [h.id for h in result.created] == ids and not result.failed
    assert [n for n in built if n.startswith("create")] == ["create_many"]
    forks.fork_many(registry, "src", ["c-alone"], edits={"c-alone": closing})  # create.lua, one child
    forks.fork_many(registry, "src", ["e-alone"], edits={"e-alone": opening})
    assert [n for n in built if n.startswith("create")] == ["create_many", "create", "create"]

    def stored(sid: str) -> tuple[Any, ...]:
        record = redis.hgetall(keys.session(sid))
        record.pop(b"instance")
        return (record, redis.lrange(keys.session_log(sid), 0, -1), redis.lrange(keys.session_turns(sid), 0, -1))

    assert stored("c") == stored("c-alone") and stored("e") == stored("e-alone")
    assert stored("a") == stored("b") == stored("d")
    assert registry.length("c") == registry.length("a") + 3 and registry.events("e")[-1].type == "user/message"
    assert forks.fork(registry, "c", "c-child").parent_session == "c"  # its edits closed a turn
    with pytest.raises(ForkError) as info:
        forks.fork(registry, "e", "e-child")  # its edit leaves the turn open
    assert info.value.code is ErrorCode.OPEN_TURN


def test_a_refusal_among_the_many_is_that_childs_alone(registry: Registry) -> None:
    registry.append(registry.create("src"), turn())
    registry.create("taken")
    result = forks.fork_many(registry, "src", ["x", "taken", "y"])
    assert [h.id for h in result.created] == ["x", "y"]
    assert [(sid, error.code) for sid, error in result.failed] == [("taken", "SESSION_ALREADY_EXISTS")]
    assert set(registry.children("src")) == {"x", "y"}


def test_a_fan_out_builds_its_childrens_create_calls_as_one(redis: Redis,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Where each child has its call (the old record layout here; a cluster), the calls are built
    from one template."""
    registry = Registry(redis, compact_records=False)
    registry.append(registry.create("src", cwd="/w"), turn())
    built = counted_builds(monkeypatch)
    result = forks.fork_many(registry, "src", [f"c{i}" for i in range(64)])
    assert len(result.created) == 64 and not result.failed
    assert built.count("create") == 1, built.count("create")  # one per child before


def test_create_answers_created_for_a_new_child_and_the_header_for_a_replay(
        redis: Redis, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    registry.append(registry.create("src", cwd="/w"), turn())
    replies: list[list[Any]] = []
    eval_many = lua.eval_many

    def recorded(*args: Any, **kwargs: Any) -> list[Any]:
        out = eval_many(*args, **kwargs)
        replies.append(list(out))
        return out

    monkeypatch.setattr(lua, "eval_many", recorded)
    snap = registry.take_snapshot("src")
    first = registry.create_children(snap, ["a", "b"], request_id="r-1")
    again = registry.create_children(snap, ["a", "b"], request_id="r-1")  # a replay: the stored record's
    assert replies[0] == [[CREATED, CREATED]]  # one create_many call
    assert [wire.decode_header(raw) for raw in replies[1][0]] == first == again
    assert [(h.id, h.cwd, h.parent_session, h.seed_length) for h in first] == [("a", "/w", "src", 4),
                                                                               ("b", "/w", "src", 4)]
    assert [registry.header(c) for c in ("a", "b")] == first


def test_a_fan_outs_source_step_probes_its_new_ids_with_one_command(redis: Redis, registry: Registry) -> None:
    """On one server the source step asks whether any of a fan-out's ids exists in one ``EXISTS``
    (most are new), reading each record only when some exist."""
    registry.append(registry.create("src"), turn())
    ids = [f"p{i}" for i in range(32)]
    before = command_calls(redis)
    plan = registry.prepare_fork("src", ids, request_id="r-p")
    after = command_calls(redis)
    assert plan.existing == [] and plan.replayed == {}
    assert after.get("cmdstat_exists", 0) - before.get("cmdstat_exists", 0) == 1
    # at most the snapshot script's own read of the source: no child's record
    assert after.get("cmdstat_hmget", 0) - before.get("cmdstat_hmget", 0) <= 1
    forks.fork_many(registry, "src", ids[:2], request_id="r-p")
    registry.create("p5")
    plan = registry.prepare_fork("src", ids, request_id="r-p")  # some exist: each read
    assert plan.existing == ["p5"] and sorted(plan.replayed) == ["p0", "p1"]


def test_a_child_step_looks_at_its_new_children_with_one_exists(redis: Redis, registry: Registry) -> None:
    """``create_many.lua`` asks whether any of its children exists in one ``EXISTS``: new children
    get no look of their own."""
    registry.append(registry.create("src"), turn())
    snap = registry.take_snapshot("src")
    ids = [f"n{i}" for i in range(8)]
    before = command_calls(redis)
    made = registry.create_children(snap, ids)
    after = command_calls(redis)
    assert [h.id for h in made if not isinstance(h, ForkError)] == ids
    assert after.get("cmdstat_exists", 0) - before.get("cmdstat_exists", 0) == 1


def test_an_id_taken_since_the_source_step_is_refused_in_any_place_of_the_call(registry: Registry) -> None:
    """An id taken between a fan-out's source step and its child step (another owner's, in any
    place of a ``create_many`` call) is ``SESSION_ALREADY_EXISTS`` there, its record untouched; the
    others are created."""
    registry.append(registry.create("src"), turn())
    snap = registry.take_snapshot("src")
    registry.create("t3")  # another owner takes an id between the source step and the child step
    kept = registry.redis.hgetall(keys.session("t3"))
    result = registry.create_children(snap, [f"t{i}" for i in range(5)])
    refused = result[3]
    assert isinstance(refused, ForkError) and refused.code is ErrorCode.SESSION_ALREADY_EXISTS
    assert [h.id for h in result if not isinstance(h, ForkError)] == ["t0", "t1", "t2", "t4"]
    assert registry.redis.hgetall(keys.session("t3")) == kept
    assert "t3" not in registry.children("src")


def test_each_childs_record_is_written_by_one_hset_edits_or_not(redis: Redis, registry: Registry) -> None:
    """A child's record is one ``HSET``, a child with edits included (their count, and where its
    seed ended when its edits close a turn, go in the same command): in a fan-out's
    ``create_many`` call and in ``create.lua`` alike."""
    registry.append(registry.create("src"), turn())
    closing = [NewEvent("turn/start"), NewEvent("user/message", {"text": "x"}), NewEvent("turn/end")]
    opening = [NewEvent("user/message", {"text": "y"})]

    def hsets(fork: Any) -> int:
        before = command_calls(redis).get("cmdstat_hset", 0)
        fork()
        return command_calls(redis)["cmdstat_hset"] - before

    assert hsets(lambda: forks.fork_many(registry, "src", ["a", "b", "c"], edits={"b": closing, "c": opening})) == 3
    assert hsets(lambda: forks.fork_many(registry, "src", ["alone"], edits={"alone": closing})) == 1
    assert registry.length("b") == registry.length("alone") == registry.length("a") + 3
