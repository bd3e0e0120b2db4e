"""The compact record layout (core/records.py, core/scripts/lib/header.lua) on a real server:
records small enough for Redis's listpack encoding at its defaults, the same wire JSON from
either layout, Lua's header pinned to Python's, and every reader taking records written in the
old layout (one JSON ``header``, one JSON ``outcome``: earlier versions, or
``SESSIONFORK_COMPACT_RECORDS=0``)."""

from __future__ import annotations

import json

import pytest
from helpers import stored_outcome
from msgspec import UNSET
from redis import Redis
from waits import outcome_of

from sessionfork.core import forks, keys, lua, records, wire
from sessionfork.core.config import Settings
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, Header, NewEvent
from sessionfork.ops import diff, lineage
from sessionfork.protocol.outcomes import read_outcome
from sessionfork.worker.outcomes import Outcomes
from sessionfork.worker.service import RequestService

TURN = [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})]
HEADERS = [
    Header(version=0, id="a", created_at=1_764_547_200_123),
    Header(version=0, id="b/c", created_at=1, cwd="/work/dir", parent_session="p.1", seed_length=4),
    Header(version=0, id="d", created_at=2, cwd="", parent_session="a", seed_length=0),
    Header(version=0, id="e", created_at=3, cwd='q"uo\\te\n\t\u00e9\u4e2d/\U0001f600', parent_session="x",
           seed_length=12, kept_from=7),
    Header(version=3, id="f", created_at=4, kept_from=2),
]


@pytest.mark.parametrize("header", HEADERS, ids=[h.id for h in HEADERS])
def test_lua_writes_the_same_header_json_as_python(redis: Redis, header: Header) -> None:
    """lib/header.lua's header_json is wire.encode_header, byte for byte, from either layout."""
    script = lua.source("lib/header.lua") + ("local r = redis.call('HMGET', KEYS[1], 'header', 'cwd', 'parent')\n"
                                             "return header_json(ARGV[1], r[1], r[2], r[3])")
    for compact in (True, False):
        redis.delete("rec")
        redis.hset("rec", mapping=records.header_fields(header, compact=compact))
        raw = redis.eval(script, 1, "rec", header.id)
        assert raw == wire.encode_header(header), (compact, raw)
        assert records.decode_header(header.id, *redis.hmget("rec", list(records.HEADER_FIELDS))) == header


def test_compact_fields_fit_a_listpack_at_redis_defaults(redis: Redis) -> None:
    registry = Registry(redis)
    registry.append(registry.create("src", cwd="/workspace"), TURN)
    reply = RequestService(registry, Outcomes(redis, ttl=60, stream_maxlen=10), reply_channel="sf:replies").handle(
        '{"source":"src","sessionId":"session-0d3b0a7c-6f2e-4d0b-9a55-1f1f7c1c9e21"}', "req-1")
    assert isinstance(reply, ForkResult)
    assert redis.object("encoding", keys.session(reply.session.id)) == b"listpack"
    assert redis.object("encoding", keys.request("req-1")) == b"listpack"
    assert set(redis.hkeys(keys.request("req-1"))) == {b"digest", b"request", b"child", b"header", b"cwd", b"parent"}
    assert stored_outcome(redis, "req-1") == wire.encode(reply)  # the same wire JSON, rebuilt
    assert read_outcome(redis, "req-1", None) == reply
    registry.delete(reply.session.id)  # the lifecycle event carries the wire header, not the fields
    (deleted,) = [f for _, f in redis.xrange(keys.LIFECYCLE_STREAM) if f[b"type"] == b"session/deleted"]
    assert deleted[b"header"] == wire.encode_header(reply.session)


def test_a_compact_outcome_stands_against_a_later_one(redis: Redis) -> None:
    outcomes = Outcomes(redis, ttl=60, stream_maxlen=10)
    first = ForkResult(request_id="r", session=HEADERS[1])
    assert outcomes.record(first, "sf:replies") == first
    later = ForkFailure(request_id="r", code="INTERNAL", message="later")
    assert outcomes.record(later, "sf:replies") == first
    assert not redis.hexists(keys.request("r"), "outcome")
    assert outcomes.get("r") == first


def test_setting_0_writes_the_old_layout(redis: Redis) -> None:
    settings = Settings(compact_records=False)
    registry = Registry.from_settings(redis, settings)
    registry.append(registry.create("src", cwd="/w"), TURN)
    reply = RequestService.from_settings(registry, redis, settings).handle('{"source":"src","sessionId":"c"}', "r")
    assert isinstance(reply, ForkResult)
    assert redis.hget(keys.request("r"), "outcome") == wire.encode(reply)
    assert not redis.hexists(keys.request("r"), "child")
    assert json.loads(redis.hget(keys.session("c"), "header") or b"")["parentSession"] == "src"
    assert not redis.hexists(keys.session("c"), "parent")


def test_every_reader_takes_records_written_in_the_old_layout(redis: Redis) -> None:
    """An earlier version's records (old layout) under a current registry and clients: read, forked
    (the parent check), diffed, in the lineage, deleted (the lifecycle event's header)."""
    old = Registry(redis, compact_records=False)
    new = Registry(redis)
    old.append(old.create("root", cwd="/w"), TURN)
    forks.fork(old, "root", "mid")
    old.append("mid", TURN)
    # Really the old shape: one JSON header, as earlier versions wrote it.
    stored = json.loads(redis.hget(keys.session("mid"), "header") or b"")
    assert stored == {"version": 0, "id": "mid", "createdAt": stored["createdAt"], "cwd": "/w",
                      "parentSession": "root", "seedLength": 2}
    mid = outcome_of(lambda: new.header("mid"))
    assert isinstance(mid, wire.Header), mid  # the old layout read by today's reader
    assert (mid.parent_session, mid.cwd, mid.seed_length) == ("root", "/w", 2)
    child = forks.fork(new, "mid", "leaf")  # a compact child of an old-layout parent
    assert child.parent_session == "mid" and child.cwd == "/w" and child.seed_length == 4
    assert redis.hget(keys.session("leaf"), "parent") == b"mid"
    assert [e.seq for e in new.events("leaf")] == [0, 1, 2, 3]
    assert forks.fork(old, "leaf", "old-leaf").parent_session == "leaf"  # and the other way round
    assert new.header("old-leaf") == old.header("old-leaf")
    tree = lineage.lineage(new, "root")
    assert [c.id for c in tree.root.children] == ["mid"]
    assert [c.id for c in tree.root.children[0].children] == ["leaf"]
    assert (diff.diff(new, "leaf", "old-leaf").shared, diff.diff(new, "leaf", "old-leaf").ancestor) == (4, "leaf")
    new.delete("old-leaf")
    new.delete("mid")  # pinned by leaf: a tombstone naming its parent
    deleted = [f for _, f in redis.xrange(keys.LIFECYCLE_STREAM) if f[b"type"] == b"session/deleted"]
    assert [wire.decode_header(f[b"header"]).id for f in deleted] == ["old-leaf", "mid"]
    assert wire.decode_header(deleted[1][b"header"]).parent_session == "root"
    assert new.events("leaf")[-1].seq == 3
    assert diff.diff(new, "leaf", "root").ancestor == "root"  # through mid's tombstone


def test_clients_read_an_outcome_stored_in_the_old_layout(redis: Redis) -> None:
    reply = ForkResult(request_id="old", session=HEADERS[1])
    redis.hset(keys.request("old"), mapping={"digest": "d", "outcome": wire.encode(reply)})
    assert read_outcome(redis, "old", None) == reply
    assert Outcomes(redis, ttl=60, stream_maxlen=10).get("old") == reply
    assert Outcomes(redis, ttl=60, stream_maxlen=10).record(
        ForkFailure(request_id="old", code="INTERNAL", message="x"), "sf:replies") == reply
    assert records.decode_outcome("x", [None, None, None, None, None]) is None
    assert records.decode_header("a", b"[0,1]").cwd is UNSET
