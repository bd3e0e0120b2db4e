"""Fast logic tests of Registry on fakeredis: injected clock / ids / tokens, and validation first."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import count
from typing import Any

import fakeredis
import pytest

from sessionfork.core import forks, keys
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.registry import Registry
from sessionfork.core.wire import Header, LiveHandle, NewEvent, SeedMeta

TURN = [NewEvent("turn/start"), NewEvent("user/message", {"text": "hi"}), NewEvent("turn/end")]


class Tripwire(fakeredis.FakeRedis):
    """A fake Redis that, once armed, fails on any command, pipeline or script call."""

    def __init__(self) -> None:
        super().__init__(server=fakeredis.FakeServer())
        self.armed = False
        self.calls: list[tuple[Any, ...]] = []

    def _trip(self, what: tuple[Any, ...]) -> None:
        if self.armed:
            self.calls.append(what)
            raise AssertionError(f"Redis used before id validation: {what!r}")

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self._trip(args)
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        self._trip(("pipeline",))
        return super().pipeline(transaction, shard_hint)


def counter(prefix: str) -> Callable[[], str]:
    numbers = count(1)
    return lambda: f"{prefix}-{next(numbers)}"


@pytest.fixture
def fake() -> Iterator[fakeredis.FakeRedis]:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield client
    client.close()


@pytest.fixture
def pinned(fake: fakeredis.FakeRedis) -> Registry:
    return Registry(fake, clock=lambda: 1_700_000_000_000, new_id=counter("gen"), new_token=counter("tok"))


def test_create_without_id_uses_injected_new_id_and_token(pinned: Registry) -> None:
    assert pinned.create() == LiveHandle("gen-1", "tok-1")
    assert pinned.instance("gen-1") == "tok-1"


def test_create_stamps_header_with_injected_clock(pinned: Registry) -> None:
    pinned.create("a", cwd="/w")
    assert pinned.header("a") == Header(version=0, id="a", created_at=1_700_000_000_000, cwd="/w")


def test_create_with_explicit_id_does_not_call_new_id(pinned: Registry) -> None:
    pinned.create("a")
    assert pinned.create() == LiveHandle("gen-1", "tok-2")


def test_create_of_a_generated_id_that_exists_is_already_exists(fake: fakeredis.FakeRedis) -> None:
    registry = Registry(fake, new_id=lambda: "same")
    registry.create()
    with pytest.raises(ForkError) as info:
        registry.create()
    assert (info.value.code, info.value.message) == (
        ErrorCode.SESSION_ALREADY_EXISTS, 'session "same" already exists'
    )


def test_append_stamps_events_with_injected_clock(fake: fakeredis.FakeRedis) -> None:
    now = iter([10, 20, 30])
    registry = Registry(fake, clock=lambda: next(now))
    handle = registry.create("a")
    first = registry.append(handle, TURN[:2])
    second = registry.append(handle, TURN[2:])
    assert [(e.seq, e.time) for e in first + second] == [(0, 20), (1, 20), (2, 30)]
    assert [(e.seq, e.time) for e in registry.events("a")] == [(0, 20), (1, 20), (2, 30)]


def test_fork_without_child_id_uses_injected_id_token_and_clock(fake: fakeredis.FakeRedis) -> None:
    now = iter([100, 200, 300])
    registry = Registry(fake, clock=lambda: next(now), new_id=counter("gen"), new_token=counter("tok"))
    registry.create("src", cwd="/w")
    registry.append("src", TURN)
    header = forks.fork(registry, "src")
    assert header == Header(version=0, id="gen-1", created_at=300, cwd="/w", parent_session="src",
                            seed_length=3)
    assert registry.instance("gen-1") == "tok-2"
    assert registry.instance("src") == "tok-1"
    assert registry.children("src") == ["gen-1"]


def test_fork_copies_events_by_reference(pinned: Registry, fake: fakeredis.FakeRedis) -> None:
    pinned.create("src")
    pinned.append("src", TURN)
    forks.fork(pinned, "src", "child")
    assert pinned.events("child") == pinned.events("src")
    assert not fake.exists(keys.session_log("child"))


def test_snapshot_returns_events_and_seed_meta(pinned: Registry) -> None:
    pinned.create("src", cwd="/w")
    pinned.append("src", TURN)
    events, meta = forks.snapshot(pinned, "src")
    assert [e.type for e in events] == ["turn/start", "user/message", "turn/end"]
    assert meta == SeedMeta(parent_session="src", seed_length=3, cwd="/w")


def test_open_turn_is_reported_with_last_event_type(pinned: Registry) -> None:
    pinned.create("src")
    pinned.append("src", TURN[:2])
    with pytest.raises(ForkError) as info:
        forks.fork(pinned, "src", "child")
    assert (info.value.code, info.value.message) == (
        ErrorCode.OPEN_TURN, 'cannot fork session "src" inside an open turn (last event: user/message)'
    )


def test_empty_event_list_appends_nothing(pinned: Registry) -> None:
    handle = pinned.create("a")
    assert pinned.append(handle, []) == []
    assert pinned.length("a") == 0


BAD = "bad id"


@pytest.fixture
def armed() -> Iterator[tuple[Registry, Tripwire]]:
    client = Tripwire()
    registry = Registry(client)
    registry.create("good")
    registry.append("good", TURN)
    client.armed = True
    yield registry, client
    client.close()


OPERATIONS: dict[str, Callable[[Registry], object]] = {
    "create": lambda r: r.create(BAD),
    "append by id": lambda r: r.append(BAD, TURN),
    "append by handle": lambda r: r.append(LiveHandle(BAD, "t"), TURN),
    "append nothing": lambda r: r.append(BAD, []),
    "dispose by id": lambda r: r.dispose(BAD),
    "dispose by handle": lambda r: r.dispose(LiveHandle(BAD, "t")),
    "header": lambda r: r.header(BAD),
    "instance": lambda r: r.instance(BAD),
    "length": lambda r: r.length(BAD),
    "exists": lambda r: r.exists(BAD),
    "events": lambda r: r.events(BAD),
    "children": lambda r: r.children(BAD),
    "take_snapshot": lambda r: r.take_snapshot(BAD),
    "prepare_fork bad source": lambda r: r.prepare_fork(BAD, ["child"]),
    "prepare_fork bad child": lambda r: r.prepare_fork("good", ["child", BAD]),
    "snapshot": lambda r: forks.snapshot(r, BAD),
    "snapshot by handle": lambda r: forks.snapshot(r, LiveHandle(BAD, "t")),
    "fork bad source": lambda r: forks.fork(r, BAD, "child"),
    "fork bad child": lambda r: forks.fork(r, "good", BAD),
    "fork bad child with request id": lambda r: forks.fork(r, "good", "x{y}", request_id="r1"),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_invalid_id_is_rejected_before_any_redis_call(
    armed: tuple[Registry, Tripwire], operation: str
) -> None:
    registry, client = armed
    with pytest.raises(ForkError) as info:
        OPERATIONS[operation](registry)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert client.calls == []


def test_invalid_child_id_is_rejected_before_redis_in_create_child(
    armed: tuple[Registry, Tripwire],
) -> None:
    registry, client = armed
    client.armed = False
    snap = registry.take_snapshot("good")
    client.armed = True
    with pytest.raises(ForkError) as info:
        registry.create_child(snap, BAD)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert client.calls == []


@pytest.mark.parametrize("call", [
    lambda r: r.header("good"),
    lambda r: r.append("good", TURN),
    lambda r: forks.fork(r, "good", "child"),
])
def test_tripwire_catches_valid_calls(armed: tuple[Registry, Tripwire], call: Callable[[Registry], object]) -> None:
    # Guards the guard: the armed client really fails on commands, scripts and pipelines.
    registry, client = armed
    with pytest.raises(AssertionError, match="Redis used before id validation"):
        call(registry)
    assert client.calls
