"""The worker's ``Trip``: its parts at the head, the ops' results by group, one round trip; a
server that lost its scripts re-runs only the script calls, never a part's commands."""

from __future__ import annotations

from typing import Any

from monitoring import monitored
from redis import Redis
from redis.exceptions import ResponseError
from waits import outcome_of, raised

from sessionfork.core import forks, keys
from sessionfork.core.registry import Registry
from sessionfork.core.wire import NewEvent
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker.trip import Trip


class Counting:
    """A part that counts its sends in the server (INCR) and keeps the replies it was given."""

    def __init__(self) -> None:
        self.replies: list[Any] = []

    def add(self, pipe: Any) -> None:
        pipe.incr("trip:part")
        pipe.get("trip:part")

    def done(self, replies: list[Any]) -> None:
        self.replies = replies


def source(registry: Registry) -> None:
    registry.append(registry.create("src"), [NewEvent("turn/start"), NewEvent("turn/end")])


def test_parts_go_first_and_each_group_gets_its_own_results_in_one_round_trip(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    source(registry)
    spec = forks.make_spec("src", ["c1", "c2"])
    forks.plan(registry, spec)  # the snapshot script loaded: one EVALSHA below, no NOSCRIPT re-run
    part = Counting()
    with monitored(server) as seen:
        trip = Trip(redis)
        trip.add(part)
        first = trip.ops([("SET", "trip:a", "1"), ("GET", "trip:part")])
        looked = forks.source_ops(registry, spec, redis)
        assert looked is not None
        trip.ops(looked)
        (own, look) = trip.run()
    assert first == 0
    assert part.replies == [1, b"1"]
    assert own == [True, b"1"]  # the part's commands ran before the ops
    plan = forks.plan(registry, spec, look)
    assert plan.snapshot is not None and plan.snapshot.length == 2 and plan.existing == []
    sent = [c.name for c in seen
            if c.client != "lua" and c.name in {"INCRBY", "SET", "GET", "EXISTS", "HMGET", "EVALSHA"}]
    assert sent == ["INCRBY", "GET", "SET", "GET", "EXISTS", "EVALSHA"]  # the fan-out's ids: one probe


def test_a_server_that_lost_its_scripts_reruns_the_script_calls_only(redis: Redis, registry: Registry) -> None:
    source(registry)
    spec = forks.make_spec("src", ["c1"])
    looked = forks.source_ops(registry, spec, redis)
    assert looked is not None
    redis.script_flush()  # a restart: the scripts are gone, the calls get NOSCRIPT and did not run
    part = Counting()
    trip = Trip(redis)
    trip.add(part)
    trip.ops(looked)
    ran = outcome_of(trip.run)
    assert not isinstance(ran, str), ran  # the calls that got NOSCRIPT ran again, their scripts loaded
    assert redis.get("trip:part") == b"1"  # the part's commands were sent once
    plan = forks.plan(registry, spec, ran[0])
    assert plan.snapshot is not None and plan.snapshot.length == 2


def test_an_error_reply_of_an_op_raises_after_the_parts_heard_their_replies(redis: Redis) -> None:
    redis.set("trip:text", "x")
    part = Counting()
    trip = Trip(redis)
    trip.add(part)
    trip.ops([("INCR", "trip:text")])
    assert isinstance(raised(trip.run), ResponseError)
    assert part.replies == [1, b"1"]


def test_the_source_step_rides_only_on_the_registrys_own_single_server(server: EmbeddedServer, redis: Redis,
                                                                        registry: Registry) -> None:
    spec = forks.make_spec("src", ["c1"])
    other = server.client()
    try:
        assert forks.source_ops(registry, spec, other) is None  # another client: the step runs alone
    finally:
        other.close()
    looked = forks.source_ops(registry, spec, redis)
    assert looked is not None
    assert looked[0] == ("HMGET", keys.session("c1"), "req", "header", "cwd", "parent")


def test_reads_the_same_as_one_sent_earlier_in_the_trip_are_sent_once_and_share_its_reply(
        server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    source(registry)
    specs = [forks.make_spec("src", [f"c{i}"]) for i in range(3)]
    forks.plan(registry, specs[0])  # the snapshot script loaded: no NOSCRIPT re-run below
    other = [forks.make_spec("src", ["d0"], boundary=1)]  # another source step: not the same op
    with monitored(server) as seen:
        trip = Trip(redis)
        looks = []
        for spec in [*specs, *other]:
            looked = forks.source_ops(registry, spec, redis)
            assert looked is not None
            looks.append(trip.reads(looked))
        trip.ops([("SET", "trip:a", "1")])
        groups = trip.run()
    assert looks == [0, 1, 2, 3]
    ran = [c.name for c in seen if c.client != "lua" and c.name in {"HMGET", "EVALSHA", "SET"}]
    assert ran == ["HMGET", "EVALSHA", "HMGET", "HMGET", "HMGET", "EVALSHA", "SET"]  # one step per source
    plans = [forks.plan(registry, spec, groups[i]) for i, spec in enumerate([*specs, *other])]
    assert [p.snapshot.length for p in plans if p.snapshot is not None] == [2, 2, 2, 2]
    assert groups[0][-1] == groups[1][-1] == groups[2][-1]  # the one step's reply, shared
    assert groups[4] == [True]
