"""The any-language recipe (docs/any-language.md) works: raw Redis commands submit a fork and get its reply, and
detect a reused request id: a different request under a used id is refused by the
enqueue script (-1, nothing enqueued), and no request id ever has two outcomes announced.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import make_client, outcome_entries, start_worker, stop, wait_registered, worker_name
from redis import Redis

from sessionfork import NewEvent, Registry
from sessionfork.core import keys, lua, wire
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol.outcomes import read_outcome

PRODUCER = Path(__file__).parent.parent / "data" / "raw_producer.py"
RECIPE = (Path(__file__).parents[2] / "docs" / "any-language.md").read_text()
ENQUEUE = lua.source("enqueue.lua", "sessionfork.protocol")
SHIPPED = Path(__file__).resolve().parents[2] / "src" / "sessionfork" / "protocol" / "scripts" / "enqueue.lua"


@pytest.fixture
def worker(server: EmbeddedServer, redis: Redis) -> Iterator[None]:
    name = worker_name("raw")
    proc = start_worker(server.url, name)
    wait_registered(redis, name)
    yield
    assert stop(proc) == 0


def produce(server: EmbeddedServer, source: str, child: str, request_id: str, *extra: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, str(PRODUCER), str(server.port), source, child, request_id, *extra],
                         capture_output=True, text=True, timeout=60, check=True)
    reply: dict[str, object] = json.loads(out.stdout)
    return reply


def add_source(registry: Registry, sid: str) -> None:
    registry.create(sid)
    registry.append(sid, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])


def enqueue(redis: Redis, request: dict[str, object]) -> int:
    rid = str(request["requestId"])
    return int(redis.eval(ENQUEUE, 3, f"rq:job:{rid}", "rq:queue:sessionfork", keys.request(rid), rid,
                          json.dumps(request), "origin", "sessionfork", "status", "queued"))


def test_raw_redis_producer_gets_its_fork_reply(server: EmbeddedServer, registry: Registry, worker: None) -> None:
    add_source(registry, "raw-src")
    reply = produce(server, "raw-src", "raw-child", "raw-1")
    assert reply == {"type": "fork/result", "requestId": "raw-1", "ok": True,
                     "session": {**reply["session"], "id": "raw-child", "parentSession": "raw-src",  # type: ignore[dict-item]
                                 "seedLength": 2}}
    assert registry.header("raw-child").parent_session == "raw-src"


def test_raw_producer_rebuilds_a_compact_reply_as_the_clients_read_it(server: EmbeddedServer, registry: Registry,
                                                                      redis: Redis, worker: None) -> None:
    registry.append(registry.create("cwd-src", cwd="/w/\u00fc \"q\""), [NewEvent("turn/start", {"turn": 1}),
                                                                       NewEvent("turn/end", {"turn": 1})])
    for rid, child, fields in (("c-1", "c-plain", "{}"), ("c-2", "c-sum", '{"summary": {"keepFrom": 2}}')):
        reply = produce(server, "cwd-src", child, rid, "604800", "", "", fields)
        assert redis.hexists(keys.request(rid), "child") and not redis.hexists(keys.request(rid), "outcome")
        stored = read_outcome(redis, rid, None)  # what the Python clients answer
        assert stored is not None and reply == json.loads(wire.encode(stored))
    assert json.loads(wire.encode(stored))["session"]["keptFrom"] == 2


def test_raw_producer_fcalls_the_loaded_library_and_gets_its_fork_reply(server: EmbeddedServer, registry: Registry,
                                                                        redis: Redis, worker: None) -> None:
    from sessionfork.protocol.enqueue import load_library

    load_library(redis)
    add_source(registry, "fc-src")
    reply = produce(server, "fc-src", "fc-child", "fc-1", "604800", "", "fcall")
    assert (reply["ok"], reply["session"]["parentSession"]) == (True, "fc-src")  # type: ignore[index]
    assert redis.function_list(library="sessionfork") != []


def test_raw_producer_forks_a_running_session_at_a_boundary(server: EmbeddedServer, registry: Registry,
                                                            worker: None) -> None:
    running = registry.create("raw-running")
    registry.append(running, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1}),
                              NewEvent("turn/start", {"turn": 2})])
    reply = produce(server, "raw-running", "raw-at", "raw-2", "604800", "1")
    assert reply == {"type": "fork/result", "requestId": "raw-2", "ok": True,
                     "session": {**reply["session"], "id": "raw-at", "parentSession": "raw-running",  # type: ignore[dict-item]
                                 "seedLength": 2}}


def test_raw_producer_guards_edits_and_variants(server: EmbeddedServer, registry: Registry, worker: None) -> None:
    add_source(registry, "rc-src")  # 2 events
    guarded = produce(server, "rc-src", "rc-1", "rc-g", "604800", "", "", json.dumps({"ifLength": 5}))
    assert (guarded["code"], guarded["message"]) == ("PRECONDITION_FAILED", 'session "rc-src" has 2 events, not 5')
    edits = [{"type": "turn/start", "data": {"turn": 2}}, {"type": "user/message", "data": "retry", "surfaceOp": "s"}]
    edited = produce(server, "rc-src", "rc-1", "rc-e", "604800", "", "", json.dumps({"ifLength": 2, "edits": edits}))
    assert edited["ok"] is True and edited["session"]["seedLength"] == 2  # type: ignore[index]
    assert [wire_event(e) for e in registry.events("rc-1")[2:]] == [
        {"type": "turn/start", "data": {"turn": 2}}, {"type": "user/message", "data": "retry", "surfaceOp": "s"}]
    other = produce(server, "rc-src", "rc-1", "rc-e", "604800", "", "", json.dumps({"ifLength": 2, "edits": edits[:1]}))
    assert other.get("code") == "IDEMPOTENCY_CONFLICT", other
    fields = {"variants": [{"sessionId": "rv-1", "edits": edits[1:]}, {"sessionId": "rv-2"}]}
    fan = produce(server, "rc-src", "-", "rc-v", "604800", "", "", json.dumps(fields))
    assert [h["id"] for h in fan["sessions"]] == ["rv-1", "rv-2"]  # type: ignore[attr-defined]
    assert registry.length("rv-1") == 3 and registry.length("rv-2") == 2


def wire_event(event: object) -> dict[str, object]:
    from sessionfork.core import wire

    body = wire.event_to_builtins(event)  # type: ignore[arg-type]
    return {k: v for k, v in body.items() if k not in ("seq", "time")}


@pytest.mark.parametrize("result_ttl", ["604800", "0"])
def test_a_raw_producer_reusing_a_request_id_gets_a_conflict_and_never_two_outcomes(
        server: EmbeddedServer, redis: Redis, registry: Registry, worker: None, result_ttl: str) -> None:
    add_source(registry, "sa")
    add_source(registry, "sb")
    first = produce(server, "sa", "b1", "rB", result_ttl)
    assert first["ok"] is True
    # result_ttl 0: RQ deletes the job hash at once; the request's record still knows the id
    assert redis.exists("rq:job:rB") == (result_ttl != "0")

    again = produce(server, "sa", "b1", "rB", result_ttl)  # a retry of the same request
    conflict = produce(server, "sb", "b2", "rB", result_ttl)

    assert again == first
    assert (conflict["ok"], conflict.get("code")) == (False, "IDEMPOTENCY_CONFLICT")
    assert not registry.exists("b2") and redis.llen("rq:queue:sessionfork") == 0
    assert [e.code for e in outcome_entries(redis) if e.request == "rB"] == ["OK"]  # one outcome, announced once


def test_a_python_submit_reusing_a_deleted_jobs_id_is_a_conflict_announced_nowhere(
        server: EmbeddedServer, redis: Redis, registry: Registry, worker: None) -> None:
    add_source(registry, "sa")
    add_source(registry, "sb")
    produce(server, "sa", "b1", "rC", "0")  # the job hash is gone: RQ enqueues the next one
    client = make_client(redis)
    with redis.pubsub(ignore_subscribe_messages=True) as pubsub:
        pubsub.subscribe(client.settings.reply_channel)
        reply = client.fork("sb", session_id="b2", request_id="rC", timeout=10)
        assert (reply.ok, getattr(reply, "code", None)) == (False, "IDEMPOTENCY_CONFLICT")
        # the clients enqueue with the script too: it saw the kept request, so nothing was queued
        assert not redis.exists("rq:job:rC") and redis.llen("rq:queue:sessionfork") == 0
        published = [m for m in iter(lambda: pubsub.get_message(timeout=0.2), None) if b'"rC"' in m["data"]]
    assert published == []  # the only announcement of rC was the first one, before we listened
    assert [e.code for e in outcome_entries(redis) if e.request == "rC"] == ["OK"]
    assert not registry.exists("b2")


def wait_job_done(redis: Redis, job_id: str) -> None:
    from waits import wait_until

    wait_until(lambda: redis.hget(f"rq:job:{job_id}", "status") in (b"finished", b"failed"), 20,
               f"job {job_id} to end")


def test_the_enqueue_script_compares_with_a_queued_request_not_yet_claimed(redis: Redis) -> None:
    first = {"requestId": "rQ", "source": "s", "sessionIds": ["x", "y"]}
    assert enqueue(redis, first) == 1
    assert enqueue(redis, {**first, "replyTo": "sf:replies:mine"}) == 0  # replyTo may differ
    assert enqueue(redis, {**first, "sessionIds": ["y", "x"]}) == -1
    assert enqueue(redis, {**first, "source": {"id": "s", "instance": "i"}}) == -1
    assert enqueue(redis, {"requestId": "rQ", "source": "s", "count": 2}) == -1
    assert enqueue(redis, {**first, "boundary": 3}) == -1  # the boundary is part of what is asked
    assert redis.lrange("rq:queue:sessionfork", 0, -1) == [b"rQ"]
    data = json.loads(redis.hget("rq:job:rQ", "data") or b"")
    assert data[0] == "sessionfork.jobs.fork" and data[1] is None and json.loads(data[2][0]) == first


def test_an_identical_raw_retry_of_data_nested_at_the_workers_limit_is_the_same_request_once_claimed(
        server: EmbeddedServer, registry: Registry, redis: Redis, worker: None) -> None:
    """Edits' data nested ``MAX_DATA_DEPTH`` deep, holding a float and an empty object
    (the script's exact reader), submitted raw, forked by a worker, then sent again: 0, never -1."""
    from sessionfork.core import rules

    add_source(registry, "deep-src")
    data: object = [1.5, {}]  # two levels
    for _ in range(rules.MAX_DATA_DEPTH - 2):
        data = {"z": data, "a": []}
    request = {"requestId": "deep-1", "source": "deep-src", "sessionId": "deep-child",
               "edits": [{"type": "note", "data": data}]}
    assert enqueue(redis, request) == 1
    wait_job_done(redis, "deep-1")
    assert redis.hexists(keys.request("deep-1"), "request")  # claimed: the worker holds the request
    assert registry.events("deep-child")[-1].data == data  # accepted, the whole depth kept
    assert enqueue(redis, request) == 0
    assert enqueue(redis, {**request, "replyTo": "sf:replies:again"}) == 0
    assert enqueue(redis, {**request, "edits": [{"type": "note", "data": [data]}]}) == -1
    assert redis.lrange("rq:queue:sessionfork", 0, -1) == []


def test_raw_producer_imports_neither_rq_nor_sessionfork_and_runs_the_shipped_script() -> None:
    """The producer reads the script from the shipped file (no copy of its own to drift), the one
    the recipe shows."""
    tree = ast.parse(PRODUCER.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"json", "sys", "time", "zlib", "pathlib", "redis"}  # zlib: CRC-32, for a sharded queue's shard
    assigned = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "ENQUEUE")
    assert isinstance(assigned, ast.Call) and getattr(assigned.func, "attr", "") == "read_text"  # a file, read
    read = eval(compile(ast.Expression(assigned.func.value), str(PRODUCER), "eval"),  # type: ignore[attr-defined]
                {"Path": Path, "__file__": str(PRODUCER)})
    assert read == SHIPPED and read.read_text() == ENQUEUE
    assert ENQUEUE in RECIPE
