"""Merges and selects through the queue: both clients and a worker process, the CLI, the
raw any-language producer (EVAL and the loaded Function library), typed ``merge/error`` and
``select/error`` outcomes for bad input, idempotent retries and ``IDEMPOTENCY_CONFLICT`` as forks',
and the outcome stream."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import SETTINGS, run_cli, turn
from redis import Redis

from sessionfork.aio import AsyncClient
from sessionfork.client import Client
from sessionfork.core import forks, keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.wire import MergeFailure, MergeResult, SelectFailure, SelectResult
from sessionfork.embedded import EmbeddedServer
from sessionfork.protocol.enqueue import library

TIMEOUT = 30.0
PRODUCER = Path(__file__).parent.parent / "data" / "raw_producer.py"
pytestmark = pytest.mark.rq


@pytest.fixture
def fam(registry: Registry) -> Registry:
    """"p" (one turn), three children k0..k2 each with one turn of its own (8 events)."""
    registry.append(registry.create("p"), turn(1))
    for i in range(3):
        forks.fork(registry, "p", f"k{i}")
        registry.append(f"k{i}", turn(10 + i))
    return registry


def test_a_merge_through_a_worker_and_its_retry(client: Client, fam: Registry, redis: Redis) -> None:
    reply = client.merge("p", "k0", mode="events", request_id="mq-1", timeout=TIMEOUT)
    assert isinstance(reply, MergeResult), reply
    assert (reply.parent, reply.length, reply.from_seq, reply.to_seq) == ("p", 4 + 2 + 4 + 1, 4, 10)
    assert reply.merged_from == wire.MergedFrom(session="k0", from_seq=4, to_seq=7)
    assert [e.type for e in fam.events("p")[4:]] == ["turn/start", "session/merge", "turn/start", "user/message",
                                                     "assistant/message", "turn/end", "turn/end"]
    again = client.merge("p", "k0", mode="events", request_id="mq-1", timeout=TIMEOUT)
    assert again == reply and fam.length("p") == 11
    conflict = client.merge("p", "k0", mode="summary", summary="x", request_id="mq-1", timeout=TIMEOUT)
    assert isinstance(conflict, MergeFailure) and conflict.code == "IDEMPOTENCY_CONFLICT"
    stale = client.merge("p", "k0", mode="events", timeout=TIMEOUT)
    assert isinstance(stale, MergeFailure) and stale.code == "ALREADY_MERGED" and '"mq-1"' in stale.message
    entries = [f for _, f in redis.xrange(keys.OUTCOME_STREAM)]
    assert [wire.text(f[b"code"]) for f in entries] == ["OK", "ALREADY_MERGED"]
    assert json.loads(entries[0][b"reply"])["type"] == "merge/result"


def test_a_select_through_a_worker(client: Client, fam: Registry) -> None:
    reply = client.select("p", ["k0", "k1", "k2"], "k2", mode="summary", summary={"best": "k2"}, timeout=TIMEOUT)
    assert isinstance(reply, SelectResult), reply
    assert (reply.winner, reply.abandoned, reply.from_seq) == ("k2", ["k0", "k1"], 4)
    assert [fam.state_of(f"k{i}").state for i in range(3)] == ["abandoned", "abandoned", "merged"]
    stale = client.select("p", ["k0", "k1"], "k0", mode="events", timeout=TIMEOUT)
    assert isinstance(stale, SelectFailure) and stale.code == "ALREADY_MERGED"


def test_a_select_with_its_candidates_reordered_is_another_request(client: Client, fam: Registry) -> None:
    """docs/guarantees.md: the candidates' order is part of a select's identity. The same select
    under its request id answers its first outcome; reordered, it is another request: under the
    same id, ``IDEMPOTENCY_CONFLICT``, nothing written."""
    reply = client.select("p", ["k0", "k1"], "k0", mode="events", request_id="sel-order", timeout=TIMEOUT)
    assert isinstance(reply, SelectResult), reply
    assert client.select("p", ["k0", "k1"], "k0", mode="events", request_id="sel-order", timeout=TIMEOUT) == reply
    length = fam.length("p")
    reordered = client.select("p", ["k1", "k0"], "k0", mode="events", request_id="sel-order", timeout=TIMEOUT)
    assert isinstance(reordered, SelectFailure) and reordered.code == "IDEMPOTENCY_CONFLICT", reordered
    assert fam.length("p") == length


@pytest.mark.parametrize(("payload", "kind", "words"), [
    ({"op": "merge", "parent": "p", "child": "k0"}, "merge/error", "mode"),
    ({"op": "merge", "parent": "p", "child": "k0", "mode": "summary"}, "merge/error", "needs a summary"),
    ({"op": "merge", "parent": "p", "child": "k0", "mode": "events", "extra": 1}, "merge/error", "extra"),
    ({"op": "merge", "parent": "p", "child": "k 0", "mode": "events"}, "merge/error", "child"),
    ({"op": "merge", "parent": "p", "child": "k0", "mode": "events", "range": {"fromSeq": -1, "toSeq": 2}},
     "merge/error", "range.fromSeq"),
    ({"op": "select", "parent": "p", "candidates": ["k0", "k1"], "winner": "k2", "mode": "events"}, "select/error",
     "not one of the candidates"),
    ({"op": "select", "parent": "p", "candidates": ["k0", "k0"], "winner": "k0", "mode": "events"}, "select/error",
     "distinct"),
    ({"op": "split", "source": "p"}, "fork/error", "unknown op"),
])
def test_bad_merge_requests_get_a_typed_error_event(server: EmbeddedServer, fam: Registry, worker: Any,
                                                     payload: dict[str, object], kind: str, words: str) -> None:
    reply = produce(server, "bad-1", payload)
    assert (reply["type"], reply["code"]) == (kind, "INVALID_REQUEST") and words in str(reply["message"]), reply
    assert fam.length("p") == 4


def test_the_asyncio_client_merges_and_selects(server: EmbeddedServer, worker: subprocess.Popen[bytes],
                                               fam: Registry) -> None:
    async def go() -> tuple[wire.MergeReply, wire.SelectReply]:
        async with AsyncClient.from_url(server.url, SETTINGS) as aio:
            merged = await aio.merge("p", "k0", mode="events", range=(4, 7), timeout=TIMEOUT)
            chosen = await aio.select("p", ["k1", "k2"], "k1", mode="summary", summary=1, timeout=TIMEOUT)
            return merged, chosen

    merged, chosen = asyncio.run(go())
    assert merged.ok and chosen.ok
    assert (merged.length, chosen.from_seq) == (11, 11)


def produce(server: EmbeddedServer, request_id: str, fields: dict[str, object], route: str = "") -> dict[str, object]:
    out = subprocess.run([sys.executable, str(PRODUCER), str(server.port), "-", "-", request_id, "604800", "",
                          route, json.dumps(fields)], capture_output=True, text=True, timeout=60, check=True)
    reply: dict[str, object] = json.loads(out.stdout)
    return reply


@pytest.mark.parametrize("route", ["eval", "fcall"])
def test_the_raw_producer_merges_and_selects(server: EmbeddedServer, redis: Redis, worker: subprocess.Popen[bytes],
                                             fam: Registry, route: str) -> None:
    if route == "fcall":
        redis.function_load(library(), replace=True)
    merge = {"op": "merge", "parent": "p", "child": "k0", "mode": "events"}
    reply = produce(server, f"raw-m-{route}", merge, route)
    assert (reply["type"], reply["length"]) == ("merge/result", 11), reply
    assert produce(server, f"raw-m-{route}", {**merge, "child": "k0"}, route) == reply  # same request: answered
    other = produce(server, f"raw-m-{route}", {**merge, "mode": "summary", "summary": 2}, route)
    assert other["code"] == "IDEMPOTENCY_CONFLICT"  # the enqueue script compares merges' fields too
    select = {"op": "select", "parent": "p", "candidates": ["k1", "k2"], "winner": "k1", "mode": "summary",
              "summary": {"t": 1}}
    chosen = produce(server, f"raw-s-{route}", select, route)
    assert (chosen["type"], chosen["abandoned"]) == ("select/result", ["k2"]), chosen


def test_cli_merge_and_select(server: EmbeddedServer, client: Client, fam: Registry) -> None:
    done = run_cli(server.url, "merge", "p", "k0", "--mode", "summary", "--summary", "-", stdin='{"text": "k0 did it"}')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["type"] == "merge/result"
    assert fam.events("p")[6].data == {"summary": {"text": "k0 did it"},
                                       "summarizes": {"session": "k0", "fromSeq": 4, "toSeq": 7}}
    picked = run_cli(server.url, "select", "p", "k1", "k2", "k1", "--mode", "events")
    assert picked.returncode == 0, picked.stderr
    assert json.loads(picked.stdout)["abandoned"] == ["k2"]
    stale = run_cli(server.url, "merge", "p", "k2", "--mode", "events")
    assert stale.returncode == 1 and json.loads(stale.stdout)["code"] == "ALREADY_MERGED"
    usage = run_cli(server.url, "merge", "p", "k0", "--mode", "summary")
    assert usage.returncode == 2 and "--summary" in usage.stderr
