"""``CallStream`` on a real server: each ``send`` reaches the server before any reply is read (the
server runs it while the caller builds the next), the results are ``lua.run``'s (NOSCRIPT run
again, an error reply raised), a dropped connection runs the calls without a reply again, once
(or, for a client that never resends a command, raises), and a stream closed with replies unread
never hands its connection back with them."""

from __future__ import annotations

import signal

import pytest
from redis import ConnectionPool, Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from waits import wait_until

from sessionfork.core import connections, lua
from sessionfork.core.call_stream import CallStream
from sessionfork.core.config import Settings
from sessionfork.embedded import EmbeddedServer

INCR = "return redis.call('INCR', KEYS[1])"
ECHO = "return ARGV[1]"
FAIL = "return redis.error_reply('ERR no such thing')"


def _calls(redis: Redis, source: str, *keys_and_args: tuple[list[str], list[str]]) -> list[lua.Call]:
    script = redis.register_script(source)
    return [(script, k, a) for k, a in keys_and_args]


def test_each_send_runs_on_the_server_before_any_reply_is_read(redis: Redis) -> None:
    with CallStream(redis) as stream:
        first = stream.send(_calls(redis, INCR, (["n:1"], []), (["n:2"], [])))
        # Nothing read yet: the server ran the calls as they arrived (the NOSCRIPT of a script
        # never loaded is answered too, and run again at the read).
        redis.script_load(INCR)
        second = stream.send(_calls(redis, INCR, (["n:3"], [])))
        wait_until(lambda: redis.get("n:3") == b"1", 10, "the second send to run before any read")
        assert stream.replies(first) == [1, 1] and stream.replies(second) == [1]
    assert [redis.get(f"n:{i}") for i in (1, 2, 3)] == [b"1", b"1", b"1"]  # each ran once


def test_the_results_are_lua_runs_in_order(redis: Redis) -> None:
    calls = _calls(redis, ECHO, ([], ["a"]), ([], ["b"]), ([], ["c"]))
    expected = lua.run(redis, calls)
    with CallStream(redis) as stream:
        tickets = [stream.send(calls[:2]), stream.send([]), stream.send(calls[2:])]
        assert [stream.replies(t) for t in tickets] == [expected[:2], [], expected[2:]]
    assert expected == [b"a", b"b", b"c"]


def test_an_error_reply_is_raised_and_the_other_sends_still_answer(redis: Redis) -> None:
    redis.script_load(FAIL)
    redis.script_load(ECHO)
    with CallStream(redis) as stream:
        bad = stream.send(_calls(redis, FAIL, ([], [])))
        good = stream.send(_calls(redis, ECHO, ([], ["ok"])))
        with pytest.raises(ResponseError, match="no such thing"):
            stream.replies(bad)
        assert stream.replies(good) == [b"ok"]


def test_scripts_flushed_mid_stream_run_again_once_loaded(redis: Redis) -> None:
    redis.script_load(INCR)
    with CallStream(redis) as stream:
        first = stream.send(_calls(redis, INCR, (["f:1"], [])))
        assert stream.replies(first) == [1]
        redis.script_flush()  # a server restarted empty would answer NOSCRIPT as well
        second = stream.send(_calls(redis, INCR, (["f:2"], [])))
        assert stream.replies(second) == [1]
    assert redis.get("f:2") == b"1"


def test_a_health_check_falling_due_mid_stream_never_reads_an_earlier_calls_reply(server: EmbeddedServer) -> None:
    # The project's client (``connections``): health checks every 30 s, a failed one retried on a
    # new connection, so a check that read an earlier call's reply would go unnoticed.
    redis = connections.queue_client(Settings(), server.url)
    try:
        redis.script_load(ECHO)
        with CallStream(redis) as stream:
            first = stream.send(_calls(redis, ECHO, ([], ["a1"]), ([], ["a2"])))
            stream._conn.next_health_check = -1  # the check falls due now: as after 30 idle seconds
            second = stream.send(_calls(redis, ECHO, ([], ["b1"]), ([], ["b2"])))
            assert stream.replies(first) == [b"a1", b"a2"] and stream.replies(second) == [b"b1", b"b2"]
    finally:
        redis.close()


def test_a_dropped_connection_runs_the_calls_without_a_reply_again_once(redis: Redis, server: EmbeddedServer) -> None:
    redis.script_load(INCR)
    killer = server.client()
    try:
        with CallStream(redis) as stream:
            first = stream.send(_calls(redis, INCR, (["d:1"], [])))
            assert stream.replies(first) == [1]
            streaming = [c for c in killer.client_list() if c["cmd"] == "evalsha"]
            assert len(streaming) == 1  # the stream's connection, idle after its reply
            assert killer.client_kill_filter(_id=streaming[0]["id"]) == 1  # the drop lands here
            second = stream.send(_calls(redis, INCR, (["d:2"], []), (["d:3"], [])))
            assert stream.replies(second) == [1, 1]  # each ran once: on the dead connection, never
        assert [redis.get(f"d:{i}") for i in (1, 2, 3)] == [b"1", b"1", b"1"]
    finally:
        killer.close()


def test_a_dropped_connection_of_a_client_that_never_resends_raises_and_runs_nothing_again(
        server: EmbeddedServer) -> None:
    """The worker's client (``resend=False``): the calls answered already may be lost on the server
    the URL names now (a promoted replica), so the stream raises and its caller runs the whole step
    again; none of the stream's calls is sent again."""
    redis = connections.queue_client(Settings(), server.url, resend=False)
    redis.script_load(INCR)
    killer = server.client()
    try:
        with CallStream(redis) as stream:
            first = stream.send(_calls(redis, INCR, (["n:1"], [])))
            assert stream.replies(first) == [1]
            streaming = [c for c in killer.client_list() if c["cmd"] == "evalsha"]
            assert len(streaming) == 1 and killer.client_kill_filter(_id=streaming[0]["id"]) == 1
            second = stream.send(_calls(redis, INCR, (["n:2"], [])))
            with pytest.raises(RedisConnectionError):
                stream.replies(second)
            with pytest.raises(RedisConnectionError):  # a later call's reply is lost too
                stream.replies(stream.send(_calls(redis, INCR, (["n:3"], []))))
        assert [redis.get(f"n:{i}") for i in (1, 2, 3)] == [b"1", None, None]
    finally:
        killer.close()
        redis.close()


def test_a_stream_closed_with_replies_unread_never_lends_them_to_the_next_command(server: EmbeddedServer) -> None:
    pool = ConnectionPool(host="127.0.0.1", port=server.port, max_connections=1)
    redis = Redis.from_pool(pool)
    try:
        redis.set("k", "value")
        redis.script_load(ECHO)
        with CallStream(redis) as stream:
            stream.send(_calls(redis, ECHO, ([], ["stale"])))
        assert redis.get("k") == b"value"  # on the pool's one connection: not the unread "stale"
    finally:
        redis.close()


def test_a_server_frozen_mid_stream_times_out_and_its_late_reply_is_never_read() -> None:
    with EmbeddedServer() as server:
        assert server.process is not None
        pool = ConnectionPool(host="127.0.0.1", port=server.port, max_connections=1, socket_timeout=0.5,
                              socket_connect_timeout=0.5)
        redis = Redis.from_pool(pool)
        try:
            redis.set("k", "value")
            script = redis.register_script(ECHO)
            redis.script_load(ECHO)
            server.process.send_signal(signal.SIGSTOP)  # connected: the call is sent, its reply never comes
            try:
                with CallStream(redis) as stream:
                    ticket = stream.send([(script, [], ["stale"])])
                    with pytest.raises(RedisTimeoutError):
                        stream.replies(ticket)
            finally:
                server.process.send_signal(signal.SIGCONT)  # the server now answers the call it read
            assert redis.get("k") == b"value"  # the pool's one connection is a new one: never "stale"
        finally:
            redis.close()


def test_a_batch_whose_child_step_fails_mid_send_gives_its_connection_back(
        server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``forks.send_many`` raising after the first fork's calls were sent (a bug in the second's
    step): the stream's connection goes back to the pool dropped, its reply never read by the next
    command (a pool of one connection serves it)."""
    from helpers import turn

    from sessionfork.core import forks
    from sessionfork.core.fork_steps import ForkSteps
    from sessionfork.core.registry import Registry

    pool = ConnectionPool(host="127.0.0.1", port=server.port, max_connections=1)
    redis = Redis.from_pool(pool)
    try:
        registry = Registry(redis)
        registry.append(registry.create("src"), turn(1))
        specs = [forks.make_spec("src", [f"mid-{i}-a", f"mid-{i}-b"]) for i in range(2)]
        planned = [(spec, forks.plan(registry, spec), None) for spec in specs]
        built: list[object] = []
        child_step = ForkSteps.child_step

        def failing(self: ForkSteps, snap: object, spec: object, child_ids: object = None) -> object:
            built.append(spec)
            if len(built) == 2:
                raise RuntimeError("a bug in the second fork's step")
            return child_step(self, snap, spec, child_ids)  # type: ignore[arg-type]

        monkeypatch.setattr(ForkSteps, "child_step", failing)
        with pytest.raises(RuntimeError, match="second fork"):
            forks.send_many(registry, planned)
        try:
            redis.set("after", "value")
            after = redis.get("after")
        except RedisConnectionError:  # the pool's one connection was never given back
            after = None
        assert after == b"value"
    finally:
        redis.close()
