"""Lineage bundles on real servers: export, import into another server and into a cluster, the
round trip, the refusals (truncated, corrupted, a taken id), a second import, the base."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cluster_fixtures import cluster_client_fixture, cluster_fixture, cluster_registry_fixture  # noqa: F401
from helpers import turn
from redis import Redis

from sessionfork import ErrorCode, ForkError, NewEvent, Summary, fork, fork_many, merge, select
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import bundles, lineage


@pytest.fixture(scope="module")
def other_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture
def target(other_server: EmbeddedServer) -> Iterator[Registry]:
    client = Redis(port=other_server.port)
    client.flushall()
    yield Registry(client)
    client.close()


def scenario(registry: Registry) -> str:
    """A subtree with every kind of session: a root forked from an ancestor deleted since, a fan-out,
    a summary child, a merge, a select (merged and abandoned branches), a disposed session, a deleted
    session whose child lives on, and edits. Returns the root's id."""
    registry.append(registry.create("anc"), turn(0))
    fork(registry, "anc", "root")
    registry.append("root", turn(1))
    fork_many(registry, "root", ["fan-0", "fan-1", "fan-2"])
    for i in range(3):
        registry.append(f"fan-{i}", turn(10 + i))
    merge(registry, "root", "fan-0", mode="events", request_id="m-1")
    select(registry, "root", ["fan-1", "fan-2"], "fan-2", mode="summary", summary={"text": "two"}, request_id="s-1")
    fork(registry, "root", "sum", summary=Summary(keep_from=4, data={"text": "turns 0-1"}))
    registry.append("sum", turn(3))
    fork(registry, "sum", "sum-child", edits=[NewEvent("user/message", {"text": "edit"})])
    fork(registry, "fan-0", "mid")
    registry.append("mid", turn(4))
    fork(registry, "mid", "leaf")
    registry.append("leaf", turn(5))
    registry.delete("mid")
    registry.dispose("sum-child")
    registry.delete("anc")
    return "root"


def export(registry: Registry, root: str, mode: bundles.Mode = "subtree") -> bytes:
    out = io.BytesIO()
    bundles.export_bundle(registry, root, out, mode=mode, page=7)
    return out.getvalue()


def opener(data: bytes) -> Any:
    return lambda: io.BytesIO(data)


def logical(data: bytes) -> dict[str, Any]:
    """A bundle as {id: (entry without ids it names but its own, its events)}: with a map of ids."""
    lines = data.splitlines()
    return {"lines": [msgspec.json.decode(line) for line in lines]}


def everything(registry: Registry, ids: list[str]) -> dict[str, Any]:
    """What each session reads as: its events, header, state, children (ids as given)."""
    out = {}
    for sid in ids:
        if registry.exists(sid):
            out[sid] = ([msgspec.to_builtins(e) for e in registry.events(sid)], msgspec.to_builtins(registry.header(sid)),
                        msgspec.to_builtins(registry.state_of(sid)), registry.children(sid))
    return out


def test_a_subtree_round_trips_to_another_server_byte_for_byte(registry: Registry, target: Registry) -> None:
    root = scenario(registry)
    first = export(registry, root)
    manifest = msgspec.json.decode(first.splitlines()[0])["bundle"]
    assert manifest["root"] == "root" and manifest["base"] == 4
    assert set(manifest["sessions"]) == {"root", "fan-0", "fan-1", "fan-2", "sum", "sum-child", "mid", "leaf"}
    done = bundles.import_bundle(target, opener(first))
    assert done.written == 8 and done.ids["leaf"] == "leaf"
    assert export(target, root) == first
    ids = [s for s in manifest["sessions"] if s != "mid"]
    assert everything(target, ids) == everything(registry, ids) | {
        "root": everything(target, ["root"])["root"]}  # the root's children hold the same ids
    assert [msgspec.to_builtins(e) for e in target.events("leaf")] == \
        [msgspec.to_builtins(e) for e in registry.events("leaf")]
    assert not target.exists("mid") and target.state_of("mid").state == "deleted"
    tree = lineage.lineage(target, root)
    assert sorted(c.id for c in tree.root.children) == sorted(c.id for c in lineage.lineage(registry, root).root.children)
    # the imported sessions work: fork, append, merge
    target.append("fan-1", turn(20))
    child = fork(target, "leaf", "leaf-child")
    assert target.events(child.id)[-1].type == "turn/end"

