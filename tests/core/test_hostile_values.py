"""Hostile values handed to the registry, on a real server.

What ``append`` accepts every reader reads back: data nested exactly ``MAX_DATA_DEPTH`` deep
round-trips through ``events``, a fork and ``persist``; deeper data, lone surrogates and values
JSON cannot carry as they are (bytes, sets, tuples, non-str keys, huge ints) are
``INVALID_REQUEST`` before any Redis call; ``RecursionError`` never escapes. A property test
hands odd Python values to create/append/fork: ``ForkError(INVALID_REQUEST)``, or a success that
reads back identically, never another exception.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import clean_environ, cli_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from waits import raised

from sessionfork.aio import AsyncClient
from sessionfork.client import Client
from sessionfork.core import keys, rules
from sessionfork.core.errors import ErrorCode, ForkError
from sessionfork.core.forks import fork
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkRequest, LiveHandle, NewEvent
from sessionfork.embedded import EmbeddedServer, free_port
from sessionfork.ops.jsonl import path_for
from sessionfork.ops.persist import JsonlBackend

LIMIT = rules.MAX_DATA_DEPTH
END = NewEvent("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


def nest(depth: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``depth`` containers, alternating list and object."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.fixture
def dead() -> Registry:
    """A registry whose server does not exist: any Redis call raises ``ConnectionError``."""
    return Registry(Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1))


def refused(call: Any, *words: str) -> ForkError:
    """The ``INVALID_REQUEST`` ``call()`` raises, its message holding ``words`` (any other
    exception, or none, fails the assertion)."""
    return an_invalid_request(raised(call), *words)


def an_invalid_request(error: Exception, *words: str) -> ForkError:
    assert isinstance(error, ForkError) and error.code is ErrorCode.INVALID_REQUEST, repr(error)
    for word in words:
        assert word in error.message, error.message
    return error


def test_data_nested_exactly_at_the_limit_reads_back_everywhere(registry: Registry, server: EmbeddedServer,
                                                                 tmp_path: Path) -> None:
    data, extra = nest(LIMIT), {"deep": nest(LIMIT, "x")}
    registry.create("deep")
    registry.append("deep", [NewEvent("tool/result", data, extra=extra), END])
    (read, _) = registry.events("deep")
    assert read.data == data and read.extra == extra
    child = fork(registry, "deep", "deep.1")
    assert registry.events(child.id)[0].data == data
    # persist, as its own process: the file holds the event exactly
    out = subprocess.run(cli_args(server.url, "persist", "--root", str(tmp_path), "--sync", "deep"),
                         env=clean_environ(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = path_for(tmp_path, registry.header("deep")).read_bytes().splitlines()
    assert msgspec.json.decode(lines[1]) == {"type": "tool/result", "seq": 0, "time": read.time, "data": data,
                                             **extra}


@pytest.mark.parametrize("depth", [LIMIT + 1, 1_000, 100_000])
def test_data_nested_past_the_limit_is_refused_naming_it_before_any_redis_call(dead: Registry, depth: int) -> None:
    refused(lambda: dead.append("s", [NewEvent("t", nest(depth))]), f"{LIMIT} levels")
    refused(lambda: dead.append("s", [NewEvent("t", 1, extra={"f": nest(depth)})]), f"{LIMIT} levels", "'f'")


def test_a_cycle_is_refused_not_a_recursion_error(dead: Registry) -> None:
    loop: list[Any] = []
    loop.append(loop)
    refused(lambda: dead.append("s", [NewEvent("t", loop)]), f"{LIMIT} levels")


@pytest.mark.parametrize("event", [
    lambda: NewEvent("t", "\ud800"),
    lambda: NewEvent("t", {"\udfff": 1}),
    lambda: NewEvent("t\ud800", 1),
    lambda: NewEvent("t", 1, extra={"x\ud800": 1}),
], ids=["data", "key", "type", "extra-name"])
def test_a_lone_surrogate_is_invalid_request(dead: Registry, event: Any) -> None:
    refused(lambda: dead.append("s", [event()]), "surrogate")


@pytest.mark.parametrize(("value", "word"), [
    (b"bytes", "bytes"), ({1, 2}, "set"), (frozenset(), "frozenset"), ((1, 2), "tuple"),
    ({1: "int key"}, "int object key"), ({None: 1}, "NoneType object key"), (2**64, "64-bit"),
    (-(2**63) - 1, "64-bit"), (10**5000, "64-bit"), (decimal.Decimal("1.5"), "Decimal"),
    (datetime.date(2026, 1, 1), "date"), (uuid.UUID(int=1), "UUID"), (object(), "object"),
    (1j, "complex"), ([b"nested"], "bytes"),
], ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_values_json_cannot_carry_as_they_are_are_refused_not_converted(dead: Registry, value: Any,
                                                                          word: str) -> None:
    refused(lambda: dead.append("s", [NewEvent("t", value)]), word)


@pytest.mark.parametrize("call", [
    lambda r: r.create("x", cwd=123), lambda r: r.create("x", cwd=b"/w"), lambda r: r.create("x", cwd="\ud800"),
    lambda r: r.create(123), lambda r: r.create(b"x"), lambda r: r.append("s", "not events"),
    lambda r: r.append("s", [{"type": "t"}]), lambda r: r.append(LiveHandle("s", 5), [NewEvent("t")]),  # type: ignore[arg-type]
    lambda r: r.append(LiveHandle(5, "i"), [NewEvent("t")]), lambda r: fork(r, "s", 5),  # type: ignore[arg-type]
    lambda r: fork(r, "s", "c", request_id=5), lambda r: NewEvent("t", extra=[("a", 1)]),
    lambda r: NewEvent("t", extra={1: 2}),
], ids=["cwd-int", "cwd-bytes", "cwd-surrogate", "id-int", "id-bytes", "events-str", "events-dict",
        "instance-int", "handle-id-int", "child-int", "request-id-int", "extra-list", "extra-int-key"])
def test_bad_arguments_are_invalid_request_before_any_redis_call(dead: Registry, call: Any) -> None:
    refused(lambda: call(dead))


def dead_clients() -> tuple[Client, AsyncClient]:
    """Both clients of a server that does not exist: any Redis call raises ``ConnectionError``."""
    port = free_port()
    return (Client(Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)),
            AsyncClient(AsyncRedis(host="127.0.0.1", port=port, socket_connect_timeout=1)))


async def arefused(call: Any, *words: str) -> None:
    """``refused`` for a coroutine's call."""
    try:
        await call()
    except Exception as exc:
        an_invalid_request(exc, *words)
    else:
        raise AssertionError("did not raise")


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, -0.5, 86400.5, 10**30, "5", None, True, [1]],
                         ids=repr)
def test_a_client_timeout_that_is_not_0_to_a_day_is_invalid_request_before_any_redis_call(timeout: Any) -> None:
    """Both clients' ``fork`` and ``wait``, on a server that does not exist: the refusal comes
    first (a Redis call would raise ``ConnectionError``), so nothing is enqueued."""
    sync, client = dead_clients()
    request = sync.request("s", request_id="r-bad-timeout")
    why = "timeout must be a number of seconds from 0 to 86400"
    refused(lambda: sync.fork("s", timeout=timeout), why)
    refused(lambda: sync.wait(request, timeout), why)

    async def both() -> None:
        async with client:
            await arefused(lambda: client.fork("s", timeout=timeout), why)
            await arefused(lambda: client.wait(request, timeout), why)

    asyncio.run(both())


@pytest.mark.parametrize("method", ["request", "fork"])
def test_an_unknown_option_is_a_type_error_naming_it_before_any_redis_call(method: str) -> None:
    """A misspelt option (``sesion_id=``) is refused as Python refuses an unknown keyword, by both
    clients' ``request`` and ``fork``, on a server that does not exist (no Redis call is made), and
    before the id factory is asked for an id."""
    sync, client = dead_clients()
    asked: list[str] = []
    sync._new_id = client._new_id = lambda: asked.append("id") or "req-x"  # type: ignore[method-assign]
    with pytest.raises(TypeError, match=rf"^Client\.{method}\(\) got an unexpected keyword argument 'sesion_id'$"):
        getattr(sync, method)("s", sesion_id="c", count=2)

    async def both() -> None:
        async with client:
            with pytest.raises(TypeError, match=rf"^AsyncClient\.{method}\(\) got an unexpected keyword argument "
                                                r"'sesion_id'$"):
                await getattr(client, method)("s", timeout=1, sesion_id="c") if method == "fork" else \
                    await client.request("s", sesion_id="c")

    asyncio.run(both())
    assert asked == []
    assert sync.request("s", session_id="c", count=None).session_id == "c"  # a known option, None: not asked for


@pytest.mark.parametrize("request_value", ["not an id!", None, 5, {"requestId": "x"}, object()],
                         ids=["str", "none", "int", "dict", "object"])
def test_a_client_request_that_is_not_a_fork_request_is_invalid_request_before_any_redis_call(
        request_value: Any) -> None:
    """Both clients' ``submit`` takes what their ``request()`` builds, and ``wait`` that or a request
    id; anything else is refused naming what it got, on a server that does not exist (no Redis
    call is made)."""
    sync, client = dead_clients()
    # A string is a request id to ``wait`` (one submitted elsewhere): refused as an id.
    expected = "invalid request id" if isinstance(request_value, str) else "expected a ForkRequest"
    refused(lambda: sync.submit(request_value), "expected a ForkRequest")
    refused(lambda: sync.wait(request_value, 1), expected)

    async def both() -> None:
        async with client:
            await arefused(lambda: client.submit(request_value), "expected a ForkRequest")
            await arefused(lambda: client.wait(request_value, 1), expected)

    asyncio.run(both())


def test_waiting_for_a_request_without_a_request_id_is_invalid_request() -> None:
    sync, client = dead_clients()
    bare = ForkRequest(source="s")
    refused(lambda: sync.wait(bare, 1), "without a request id")

    async def main() -> None:
        async with client:
            await arefused(lambda: client.wait(bare, 1), "without a request id")

    asyncio.run(main())


def test_an_event_written_around_append_too_deep_to_read_never_raises_recursion_error(
        registry: Registry, redis: Redis, tmp_path: Path) -> None:
    registry.create("bad")
    redis.rpush(keys.session_log("bad"), b'{"type":"turn/end","time":1,"data":' + b"[" * 5000 + b"]" * 5000 + b"}")
    redis.hset(keys.session("bad"), mapping={"len": 1, "last": "turn/end"})
    with pytest.raises(ForkError) as info:
        registry.events("bad")
    assert info.value.code is ErrorCode.INTERNAL and "nested too deep" in info.value.message
    registry.flush("bad")
    registry.create("good")
    registry.append("good", [NewEvent("turn/start"), END])  # a flush entry after the bad one's
    backend = JsonlBackend(registry, tmp_path, consumer="c")
    deadline = threading.Timer(30, (stop := threading.Event()).set)  # a bound, not synchronisation
    deadline.start()
    try:  # created bad, flush bad, created good, flush good: all handled and acked
        assert backend.run(stop, max_entries=4) == 4
    finally:
        deadline.cancel()
    assert len(path_for(tmp_path, registry.header("good")).read_bytes().splitlines()) == 3


# -- property: odd Python values -------------------------------------------------------------------

_ODD_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "é", "\U0001f600"]), st.binary(max_size=4),
    st.sets(st.integers(), max_size=2), st.frozensets(st.integers(), max_size=2),
    st.builds(decimal.Decimal, st.integers()), st.uuids(),
    st.just(object()), st.complex_numbers(allow_nan=False, max_magnitude=10),
)
_KEYS = st.one_of(st.text(max_size=6), st.integers(), st.none(), st.booleans(), st.just("\ud800"),
                  st.tuples(st.integers()))
_ODD = st.recursive(
    _ODD_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3),
                            st.tuples(inner)),
    max_leaves=12,
) | st.integers(LIMIT - 2, LIMIT + 2).map(nest)
_IDS = st.one_of(st.just("ok"), st.integers(), st.binary(max_size=3), st.just(""), st.just("a b"),
                 st.just("x" * 129), st.just("é"), st.none())
_CWD = st.one_of(st.none(), st.text(max_size=5), st.integers(), st.binary(max_size=3), st.just("\ud800"))
FEW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _same(a: Any, b: Any) -> bool:
    """Identical as JSON (so ``1``, ``1.0`` and ``True`` differ)."""
    return bool(msgspec.json.encode(a) == msgspec.json.encode(b))


@FEW
@given(sid=_IDS, cwd=_CWD, kind=st.one_of(st.just("tool/result"), _ODD_SCALARS), data=_ODD,
       extra=st.one_of(st.just({}), st.dictionaries(_KEYS, _ODD, max_size=2)), child=_IDS)
def test_odd_values_are_invalid_request_or_read_back_identically(registry: Registry, sid: Any, cwd: Any,
                                                                 kind: Any, data: Any, extra: Any,
                                                                 child: Any) -> None:
    unique = uuid.uuid4().hex[:8]
    sid = f"{sid}-{unique}" if sid == "ok" else sid
    child = f"child-{unique}" if child == "ok" else child
    try:
        handle = registry.create(sid, cwd=cwd)
    except ForkError as exc:
        assert exc.code is ErrorCode.INVALID_REQUEST, exc
    else:
        header = registry.header(handle.id)
        assert header.cwd == (msgspec.UNSET if cwd is None else cwd)
        sid = handle.id
    if not registry.exists(sid if isinstance(sid, str) and rules.is_valid_id(sid) else "none"):
        sid = registry.create(f"s-{unique}").id
    try:
        registry.append(sid, [NewEvent(kind, data, extra=extra), END])
    except ForkError as exc:
        assert exc.code is ErrorCode.INVALID_REQUEST, exc
    else:
        first = registry.events(sid)[0]
        assert (first.type, _same(first.data, data), _same(first.extra, extra)) == (kind, True, True)
    try:
        made = fork(registry, sid, child)
    except ForkError as exc:
        assert exc.code is ErrorCode.INVALID_REQUEST, exc
    else:
        assert child is None or made.id == child
        assert _same([msgspec.to_builtins(e) for e in registry.events(made.id)],
                     [msgspec.to_builtins(e) for e in registry.events(sid)])


@pytest.mark.parametrize(("value", "word"), [
    ((1, 2), "tuple"), ({1, 2}, "set"), (2**64, "64-bit"), ({1: "int key"}, "int object key"),
    (nest(LIMIT + 1), "nested deeper"),
], ids=["tuple", "set", "int-65-bits", "int-key", "too-deep"])
def test_edits_handed_to_the_child_step_are_checked_before_any_child_is_made(registry: Registry, value: Any,
                                                                               word: str) -> None:
    """``Registry.create_child``/``create_children`` check their edits as ``append`` does before the
    child step (which encodes them at the fork's time without walking them again): a value JSON
    cannot carry is ``INVALID_REQUEST`` naming it, and no child is made; so is a fork's."""
    registry.append(registry.create("hv-src"), [NewEvent("turn/start"), NewEvent("turn/end", {"reason": "done"})])
    snap = registry.take_snapshot("hv-src")
    refused(lambda: registry.create_child(snap, "hv-kid", edits=[NewEvent("user/message", value)]), word)
    refused(lambda: registry.create_children(snap, ["hv-a", "hv-b"], edits={
        "hv-b": [NewEvent("user/message", {"ok": 1}), NewEvent("user/message", {"x": value})]}), word)
    refused(lambda: fork(registry, "hv-src", "hv-forked", edits=[NewEvent("user/message", {"v": [value]})]), word)
    assert [registry.redis.exists(keys.session(c)) for c in ("hv-kid", "hv-a", "hv-b", "hv-forked")] == [0] * 4
