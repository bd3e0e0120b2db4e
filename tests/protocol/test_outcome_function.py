"""The reply read as one call: ``FCALL sf_outcome 1 sf:req:<id>`` and its ``EVAL`` twin
answer a request's reply JSON however the worker stored its record (compact one-child fields or one
``outcome`` JSON: a single fork, a summary fork, a fan-out, a failure), byte for byte the reply the
Python client returns, and nil for a request not answered yet (docs/any-language.md step 3).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import make_client, start_worker, stop, wait_registered, worker_name
from redis import Redis
from redis.exceptions import ResponseError

from sessionfork import NewEvent, Registry, Summary
from sessionfork.core import keys, records, wire
from sessionfork.core.wire import ForkFailure, ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol import enqueue as enqueue_module
from sessionfork.protocol.outcomes import read_outcome


def routes(redis: Redis) -> dict[str, tuple[Any, ...]]:
    """Every way to call the read: the loaded function (FCALL, FCALL_RO), the script's text (EVAL, EVALSHA)."""
    enqueue_module.load_library(redis)
    sha = redis.script_load(enqueue_module.OUTCOME_SOURCE)
    function = enqueue_module.OUTCOME_FUNCTION
    return {"FCALL": ("FCALL", function), "FCALL_RO": ("FCALL_RO", function),
            "EVAL": ("EVAL", enqueue_module.OUTCOME_SOURCE), "EVALSHA": ("EVALSHA", sha)}


def read_each(redis: Redis, request_id: str) -> dict[str, Any]:
    return {name: redis.execute_command(*head, 1, keys.request(request_id)) for name, head in routes(redis).items()}


@pytest.fixture(params=["compact", "full"])
def worker(request: pytest.FixtureRequest, server: EmbeddedServer, redis: Redis) -> Iterator[str]:
    """A worker storing records in one layout (``SESSIONFORK_COMPACT_RECORDS``)."""
    layout: str = request.param
    name = worker_name("outcome")
    proc = start_worker(server.url, name, SESSIONFORK_COMPACT_RECORDS="1" if layout == "compact" else "0")
    wait_registered(redis, name)
    yield layout
    assert stop(proc) == 0


def test_the_function_answers_what_the_client_answers_for_every_record_form(
        redis: Redis, registry: Registry, worker: str) -> None:
    registry.append(registry.create("of-src", cwd='/w/\u00fc "q"/x'), [NewEvent("turn/start", {"turn": 1}),
                                                                     NewEvent("turn/end", {"turn": 1})])
    registry.append(registry.create("of-plain"), [NewEvent("turn/start"), NewEvent("turn/end")])
    client = make_client(redis)
    replies = {
        "single": client.fork("of-src", request_id="of-1", session_id="of-child"),
        "root-like": client.fork("of-plain", request_id="of-2", session_id="of-child-2"),
        "summary": client.fork("of-src", request_id="of-3", session_id="of-sum", summary=Summary(keep_from=2)),
        "fan-out": client.fork("of-src", request_id="of-4", session_ids=["of-a", "of-b"]),
        "error": client.fork("of-missing", request_id="of-5"),
    }
    assert isinstance(replies["error"], ForkFailure) and isinstance(replies["fan-out"], ForkResult)
    compact = [rid for rid in ("of-1", "of-2", "of-3", "of-4", "of-5") if redis.hexists(keys.request(rid), "child")]
    assert compact == (["of-1", "of-2", "of-3"] if worker == "compact" else [])  # both layouts are read here
    for (form, reply), rid in zip(replies.items(), ("of-1", "of-2", "of-3", "of-4", "of-5"), strict=True):
        expected = wire.encode(reply)
        assert expected == wire.encode(read_outcome(redis, rid, None) or reply)
        assert read_each(redis, rid) == dict.fromkeys(("FCALL", "FCALL_RO", "EVAL", "EVALSHA"), expected), form
    assert json.loads(read_each(redis, "of-3")["FCALL"])["session"]["keptFrom"] == 2


@pytest.mark.parametrize("header", [
    Header(version=1, id="h-1", created_at=1_764_000_000_123),
    Header(version=1, id="h-2", created_at=1, cwd="", parent_session="p/1", seed_length=0),
    Header(version=2, id="h-3", created_at=2, cwd="C:\\dir/\u2603\n\t\x01", kept_from=7),
    Header(version=1, id="h/4\u00e9", created_at=3, seed_length=12, kept_from=5, parent_session='a"b'),
])
@pytest.mark.parametrize("compact", [True, False])
def test_every_header_shape_reads_back_as_its_reply(redis: Redis, header: Header, compact: bool) -> None:
    rid = f"hdr-{header.id}"
    reply = ForkResult(request_id=rid, session=header)
    redis.hset(keys.request(rid), mapping={"digest": "d", **records.outcome_fields(reply, compact=compact)})
    assert set(read_each(redis, rid).values()) == {wire.encode(reply)}


def test_an_old_layout_header_in_compact_fields_is_returned_as_stored(redis: Redis) -> None:
    header = Header(version=1, id="old-child", created_at=5, parent_session="old-src")
    redis.hset(keys.request("old-1"), mapping={"child": "old-child", "header": wire.encode_header(header)})
    expected = wire.encode(ForkResult(request_id="old-1", session=header))
    assert set(read_each(redis, "old-1").values()) == {expected}


def test_a_request_not_answered_yet_reads_nil(redis: Redis) -> None:
    assert set(read_each(redis, "nobody").values()) == {None}  # no record at all
    client = make_client(redis)
    client.submit(client.request("any-src", request_id="queued-1"))  # queued, no worker: claimed by no one
    redis.hset(keys.request("queued-1"), mapping={"digest": "d", "request": "[]"})  # as a claim leaves it
    assert redis.exists(keys.request("queued-1"))
    assert set(read_each(redis, "queued-1").values()) == {None}


def test_the_read_refuses_a_call_without_its_one_request_key(redis: Redis) -> None:
    for head in routes(redis).values():
        with pytest.raises(ResponseError, match="1 key expected"):
            redis.execute_command(*head, 0)
        with pytest.raises(ResponseError, match=r"sf:req:<request id>"):
            redis.execute_command(*head, 1, "rq:job:x")


def test_the_read_is_registered_read_only_in_the_library(redis: Redis) -> None:
    enqueue_module.load_library(redis)
    ((_, _, _, _, _, functions),) = redis.function_list(library=enqueue_module.LIBRARY)
    flags = {dict(zip(f[::2], f[1::2], strict=True))[b"name"].decode(): f[-1] for f in functions}
    assert flags == {enqueue_module.FUNCTION: [], enqueue_module.VERSIONED: [],
                     enqueue_module.OUTCOME_FUNCTION: [b"no-writes"]}  # FCALL_RO and replicas may run it
