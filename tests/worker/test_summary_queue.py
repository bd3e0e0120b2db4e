"""Summary seeds through the queue: both clients and a worker process, the raw any-language
producer (its FIELDS argument), the ``keepFrom`` rule as a typed failure, and ``summary`` as part
of a request's identity (the worker's digest and the enqueue script's comparison)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SETTINGS, turn
from helpers import run_fork_cli as run_cli

from sessionfork import Summary
from sessionfork.aio import AsyncClient
from sessionfork.client import Client, Variant
from sessionfork.core.registry import Registry
from sessionfork.core.wire import ForkFailure, ForkResult, Header, NewEvent, Reply
from sessionfork.embedded import EmbeddedServer

TIMEOUT = 30.0
PRODUCER = Path(__file__).parent.parent / "data" / "raw_producer.py"


@pytest.fixture
def src(registry: Registry) -> str:
    """Session "src": three finished turns (12 events)."""
    registry.append(registry.create("src", cwd="/w"), [*turn(1), *turn(2), *turn(3)])
    return "src"


def created(reply: Reply) -> Header:
    assert isinstance(reply, ForkResult) and reply.session is not None, reply
    assert isinstance(reply.session, Header)
    return reply.session


def test_a_summary_fork_through_a_worker(client: Client, registry: Registry, src: str) -> None:
    edits = [NewEvent("turn/start", {"turn": 4}), NewEvent("user/message", {"text": "go on"})]
    child = created(client.fork(src, session_id="c", summary=Summary(keep_from=8, data={"text": "two turns"}),
                                edits=edits, timeout=TIMEOUT))
    assert (child.parent_session, child.seed_length, child.kept_from) == ("src", 5, 8)
    log = registry.events("c")
    assert log[0].data == {"summary": {"text": "two turns"}, "summarizes": {"session": "src", "fromSeq": 0, "toSeq": 7}}
    assert [(e.type, e.data, e.time) for e in log[1:5]] == [(e.type, e.data, e.time) for e in registry.events(src)[8:]]
    assert [e.type for e in log[5:]] == ["turn/start", "user/message"] and [e.seq for e in log] == list(range(7))
    bad = client.fork(src, session_id="d", summary=Summary(keep_from=6, data=None), timeout=TIMEOUT)
    assert isinstance(bad, ForkFailure)
    assert (bad.code, bad.message) == ("INVALID_BOUNDARY", 'cannot summarise session "src" before keepFrom 6: '
                                                           "event 5 is inside the turn opened at seq 4")
    assert not registry.exists("d")
    fan = client.fork(src, variants=[Variant("v1", edits[:1]), Variant("v2")], boundary=7,
                      summary=Summary(keep_from=4, data="s"), timeout=TIMEOUT)
    assert isinstance(fan, ForkResult) and fan.sessions
    assert [(h.seed_length, h.kept_from) for h in fan.sessions] == [(5, 4), (5, 4)]
    assert registry.length("v1") == 6 and registry.events("v2")[1:] == [
        e.__class__(e.type, e.seq - 3, e.time, e.data, e.extra) for e in registry.events(src)[4:8]]


def test_the_asyncio_client_sends_a_summary(server: EmbeddedServer, worker: subprocess.Popen[bytes],
                                            registry: Registry, src: str) -> None:
    async def go() -> Reply:
        async with AsyncClient.from_url(server.url, SETTINGS) as aio:
            return await aio.fork(src, session_id="ac", summary=Summary(keep_from=12, data=[1]), timeout=TIMEOUT)

    assert created(asyncio.run(go())).seed_length == 1
    assert [e.type for e in registry.events("ac")] == ["session/summary"]


def test_reusing_a_request_id_with_another_summary_is_a_conflict(client: Client, registry: Registry, src: str) -> None:
    first = client.fork(src, session_id="c", summary=Summary(keep_from=8, data="a"), request_id="sum-1",
                        timeout=TIMEOUT)
    assert first.ok
    assert client.fork(src, session_id="c", summary=Summary(keep_from=8, data="a"), request_id="sum-1",
                       timeout=TIMEOUT) == first
    for other in (Summary(keep_from=8, data="b"), Summary(keep_from=4, data="a"), None):
        reply = client.fork(src, session_id="c", summary=other, request_id="sum-1", timeout=TIMEOUT)
        assert isinstance(reply, ForkFailure) and reply.code == "IDEMPOTENCY_CONFLICT"
    assert registry.length("c") == 5


def produce(server: EmbeddedServer, source: str, child: str, request_id: str,
            fields: dict[str, object]) -> dict[str, object]:
    out = subprocess.run([sys.executable, str(PRODUCER), str(server.port), source, child, request_id, "604800", "",
                          "", json.dumps(fields)], capture_output=True, text=True, timeout=60, check=True)
    reply: dict[str, object] = json.loads(out.stdout)
    return reply


def test_the_raw_producer_sends_a_summary(server: EmbeddedServer, registry: Registry, worker: subprocess.Popen[bytes],
                                          src: str) -> None:
    reply = produce(server, src, "raw-c", "raw-sum", {"summary": {"keepFrom": 4, "data": {"t": 1}}})
    assert reply["ok"] is True
    assert reply["session"] == {**reply["session"], "seedLength": 9, "keptFrom": 4}  # type: ignore[dict-item]
    assert registry.events("raw-c")[0].data["summarizes"] == {"session": "src", "fromSeq": 0, "toSeq": 3}
    # the enqueue script compares the summary too: -1, IDEMPOTENCY_CONFLICT, nothing enqueued
    other = produce(server, src, "raw-c", "raw-sum", {"summary": {"keepFrom": 4, "data": {"t": 2}}})
    assert other.get("code") == "IDEMPOTENCY_CONFLICT", other
    same = produce(server, src, "raw-c", "raw-sum", {"summary": {"data": {"t": 1}, "keepFrom": 4}})
    assert same == reply
    bad = produce(server, src, "raw-d", "raw-bad", {"summary": {"keepFrom": 0, "data": 1}})
    assert (bad["code"], bad["message"]) == ("INVALID_BOUNDARY", 'cannot summarise session "src" before keepFrom 0: '
                                                                 "expected 1 to 12 (the snapshot's 12 events)")


def test_cli_fork_with_a_summary(server: EmbeddedServer, client: Client, registry: Registry, src: str,
                                 tmp_path: Path) -> None:
    done = run_cli(server.url, src, "--session-id", "cs", "--boundary", "7", "--summary", "-",
                   stdin='{"keepFrom": 4, "data": {"text": "turn 1"}}')
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    assert (session["seedLength"], session["keptFrom"]) == (5, 4)
    assert registry.events("cs")[0].data == {"summary": {"text": "turn 1"},
                                             "summarizes": {"session": "src", "fromSeq": 0, "toSeq": 3}}
    path = tmp_path / "summary.json"
    path.write_text('{"keepFrom": 5}')
    bad = run_cli(server.url, src, "--summary", str(path))
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == "INVALID_BOUNDARY"
    for stdin, words in (("[]", "--summary"), ('{"keepFrom": "1"}', "integer"), ('{"data": 1}', "keepFrom"),
                         ('{"keepFrom": 1, "x": 2}', "--summary"), ("nope", "not JSON")):
        usage = run_cli(server.url, src, "--summary", "-", stdin=stdin)
        assert usage.returncode == 2 and words in usage.stderr, usage.stderr


@pytest.mark.parametrize("huge", [-(2**63) - 5, 2**64 + 7, 10**30])
def test_a_keep_from_beyond_64_bits_is_invalid_boundary_naming_it(client: Client, registry: Registry, src: str,
                                                                   huge: int) -> None:
    """Through the worker, as ``boundary`` answers for the same values: the rule's
    ``INVALID_BOUNDARY`` naming keepFrom, not an ``INVALID_REQUEST`` about the summary event."""
    reply = client.fork(src, session_id="h", summary=Summary(keep_from=huge, data="s"), timeout=TIMEOUT)
    assert isinstance(reply, ForkFailure)
    assert (reply.code, reply.message) == ("INVALID_BOUNDARY", f'cannot summarise session "src" before keepFrom '
                                                               f"{huge}: expected 1 to 12 (the snapshot's 12 events)")
    at = client.fork(src, session_id="h", boundary=huge, timeout=TIMEOUT)
    assert isinstance(at, ForkFailure) and at.code == "INVALID_BOUNDARY" and str(huge) in at.message
    assert not registry.exists("h")
