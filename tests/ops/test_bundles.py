"""Lineage bundles on real servers: export, import into another server and into a cluster, the
round trip, the refusals (truncated, corrupted, a taken id), a second import, the base."""

from __future__ import annotations

import hashlib
import io
import re
import signal
import subprocess
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import clean_environ, cli_args, turn
from redis import Redis
from waits import wait_until

from sessionfork import ErrorCode, ForkError, NewEvent, Summary, fork, fork_many, merge, select
from sessionfork.core import keys
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
    bundles.export_bundle(registry, root, out, mode=mode, page=7)  # pages smaller than a log: several per session
    return out.getvalue()


def opener(data: bytes) -> Any:
    return lambda: io.BytesIO(data)


def readable(registry: Registry, ids: list[str]) -> dict[str, Any]:
    """What each session reads as: its events, header, state, children."""
    return {sid: ([msgspec.to_builtins(e) for e in registry.events(sid)], msgspec.to_builtins(registry.header(sid)),
                  msgspec.to_builtins(registry.state_of(sid)), registry.children(sid))
            for sid in ids if registry.exists(sid)}


def canonical(data: bytes, back: dict[str, str] | None = None) -> dict[str, Any]:
    """A bundle with each id mapped by ``back`` (an id here to its id in the bundle), as its manifest
    (the session order aside), its base and each session's lines: comparable across id orders."""
    text = data.decode()
    for new, old in (back or {}).items():
        text = text.replace(f'"{new}"', f'"{old}"').replace(f'\\"{new}\\"', f'\\"{old}\\"')
    lines = [msgspec.json.decode(line) for line in text.splitlines()[:-1]]
    manifest = lines[0]["bundle"]
    sessions: dict[str, list[Any]] = {}
    current: list[Any] = []
    base = lines[1:1 + manifest["base"] + (1 if manifest["base"] else 0)]
    for line in lines[len(base) + 1:]:
        if isinstance(line, dict) and ("session" in line or "tombstone" in line):
            item = line.get("session") or line["tombstone"]
            item["merges"] = sorted(item.get("merges", []))  # sorted by the ids of the store it came from
            current = sessions.setdefault(item["header"]["id"] if "header" in item else item["id"], [])
        current.append(line)
    return {"manifest": {**manifest, "sessions": sorted(manifest["sessions"])}, "base": base, "sessions": sessions}


def test_a_subtree_round_trips_to_another_server_byte_for_byte(registry: Registry, target: Registry) -> None:
    root = scenario(registry)
    first = export(registry, root)
    manifest = msgspec.json.decode(first.splitlines()[0])["bundle"]
    assert manifest["root"] == "root" and manifest["base"] == 4  # its ancestor deleted: its seed is the base
    assert set(manifest["sessions"]) == {"root", "fan-0", "fan-1", "fan-2", "sum", "sum-child", "mid", "leaf"}
    done = bundles.import_bundle(target, opener(first))
    assert done.written == 8 and done.ids["leaf"] == "leaf"
    assert export(target, root) == first
    ids = [s for s in manifest["sessions"] if s != "mid"]
    assert readable(target, ids) == readable(registry, ids)
    assert target.state_of("mid").state == "deleted"  # the tombstone its child reads through
    assert lineage.render_text(lineage.lineage(target, root)).replace(" ", "") == \
        lineage.render_text(lineage.lineage(registry, root)).replace(" ", "")
    target.append("fan-1", turn(20))  # the imported sessions are sessions: append, fork, merge
    child = fork(target, "leaf", "leaf-child")
    assert [e.type for e in target.events(child.id)] == [e.type for e in registry.events("leaf")]
    target.append(child.id, turn(21))
    merged = merge(target, "leaf", child.id, mode="events")
    assert merged.length == 27


def test_a_lineage_export_starts_at_the_oldest_ancestor_still_there(registry: Registry) -> None:
    scenario(registry)
    manifest = msgspec.json.decode(export(registry, "leaf", "lineage").splitlines()[0])["bundle"]
    assert (manifest["root"], manifest["asked"], manifest["mode"]) == ("root", "leaf", "lineage")
    assert len(manifest["sessions"]) == 8
    assert msgspec.json.decode(export(registry, "leaf").splitlines()[0])["bundle"]["sessions"] == ["leaf"]


def test_new_ids_into_a_cluster_and_back_give_the_same_bundle_modulo_ids(
        registry: Registry, cluster_registry: Registry, target: Registry) -> None:
    first = export(registry, scenario(registry))
    done = bundles.import_bundle(cluster_registry, opener(first), new_ids=True)
    assert done.written == 8 and set(done.ids) == set(done.ids.values()) ^ set(done.ids.values()) | set(done.ids)
    assert not set(done.ids) & set(done.ids.values())  # every id is new
    back = {new: old for old, new in done.ids.items()}
    for old, new in done.ids.items():  # provenance: each record names its bundle and its id there
        assert cluster_registry.redis.hmget(keys.session(new), ["imported", "importedfrom"]) == \
            [done.digest.encode(), old.encode()]
    second = export(cluster_registry, done.ids["root"])
    assert canonical(second, back) == canonical(first)
    leaf = done.ids["leaf"]
    assert [msgspec.to_builtins(e) for e in cluster_registry.events(leaf)] == \
        [msgspec.to_builtins(e) for e in registry.events("leaf")]
    third = bundles.import_bundle(target, opener(second))  # cluster to a single server, ids kept
    assert third.written == 8 and export(target, done.ids["root"]) == second


def test_a_depth_1000_chain_round_trips(registry: Registry, cluster_registry: Registry) -> None:
    registry.append(registry.create("c-0"), turn(0))
    for i in range(1, 1000):
        fork(registry, f"c-{i - 1}", f"c-{i}")
        registry.append(f"c-{i}", turn(i))
    first = export(registry, "c-0")
    assert msgspec.json.decode(first.splitlines()[0])["bundle"]["events"] == 4000
    assert bundles.import_bundle(cluster_registry, opener(first)).written == 1000
    assert export(cluster_registry, "c-0") == first
    assert [e.data for e in cluster_registry.events("c-999")][-4:] == [e.data for e in registry.events("c-999")][-4:]
    assert len(cluster_registry.events("c-999")) == 4000
    for sid in ("c-999", "c-500", "c-1"):  # each seed stored as the fork stored it: the leaf's as references
        assert cluster_registry.redis.hget(keys.session(sid), "seed") == registry.redis.hget(keys.session(sid), "seed")
    assert len(msgspec.json.decode(cluster_registry.redis.hget(keys.session("c-999"), "seed"))) == 2


def keyspace(registry: Registry) -> list[bytes]:
    return sorted(registry.redis.keys("*"))


def test_a_truncated_or_corrupted_bundle_is_refused_with_nothing_written(registry: Registry,
                                                                           target: Registry) -> None:
    first = export(registry, scenario(registry))
    ends = [m.end() for m in re.finditer(b"\n", first)]
    cuts = [*ends[:-1], *(end - 5 for end in ends), 10]  # after each line, and inside each (the last too)
    for cut in cuts:
        with pytest.raises(ForkError) as refused:
            bundles.import_bundle(target, opener(first[:cut]))
        assert refused.value.code is ErrorCode.INVALID_BUNDLE, cut
        assert refused.value.message.startswith("the bundle is truncated"), (cut, refused.value.message)
    corrupted = first.replace(b'"answer 11"', b'"answer 12"', 1)
    with pytest.raises(ForkError) as refused:
        bundles.import_bundle(target, opener(corrupted))
    assert refused.value.code is ErrorCode.INVALID_BUNDLE and "corrupted" in refused.value.message
    assert keyspace(target) == []


def resigned(data: bytes) -> bytes:
    """``data`` with its digest line made again: a bundle edited by hand, whole and consistent."""
    body = data[:data.rstrip(b"\n").rfind(b"\n") + 1]
    return body + msgspec.json.encode({"digest": hashlib.sha256(body).hexdigest()}) + b"\n"


@pytest.mark.parametrize(("old", "new", "message"), [
    (b'"parentSession":"mid","seedLength":16', b'"parentSession":"mid","seedLength":99', "seed is not within"),
    (b'"seq":17,"time":', b'"seq":17,"clock":', "is not that event"),
    (b'"type":"turn/start","seq":16', b'"type":"turn/start","seq":15', "is not that event"),
    (b'"parent":"fan-0"', b'"parent":"leaf"', "parent is not before it"),
], ids=["seed", "time", "seq", "parent"])
def test_a_bundle_edited_by_hand_is_checked_whole_before_anything_is_written(
        registry: Registry, target: Registry, old: bytes, new: bytes, message: str) -> None:
    first = export(registry, scenario(registry))
    edited = first.replace(old, new, 1)
    assert edited != first
    with pytest.raises(ForkError) as refused:
        bundles.import_bundle(target, opener(resigned(edited)))
    assert refused.value.code is ErrorCode.INVALID_BUNDLE and message in refused.value.message, refused.value
    assert keyspace(target) == []


def test_a_taken_id_is_refused_before_anything_is_written(registry: Registry, target: Registry) -> None:
    first = export(registry, scenario(registry))
    target.create("leaf")  # the last session of the bundle
    before = keyspace(target)
    with pytest.raises(ForkError) as refused:
        bundles.import_bundle(target, opener(first))
    assert refused.value.code is ErrorCode.SESSION_ALREADY_EXISTS and "leaf" in refused.value.message
    assert keyspace(target) == before


def test_importing_the_same_bundle_again_is_a_no_op(registry: Registry, target: Registry) -> None:
    first = export(registry, scenario(registry))
    done = bundles.import_bundle(target, opener(first), new_ids=True)
    lifecycle = target.redis.xlen(keys.LIFECYCLE_STREAM)
    again = bundles.import_bundle(target, opener(first), new_ids=True)
    assert (again.written, again.ids, again.digest) == (0, done.ids, done.digest)
    assert target.redis.xlen(keys.LIFECYCLE_STREAM) == lifecycle


def test_under_a_parent_the_root_references_its_events(registry: Registry) -> None:
    scenario(registry)
    data = export(registry, "fan-1")  # base: root's first 8 events
    done = bundles.import_bundle(registry, opener(data), new_ids=True, under="root")
    copy = done.ids["fan-1"]
    assert registry.events(copy) == registry.events("fan-1")
    assert copy in registry.children("root") and registry.header(copy).parent_session == "root"
    seed = registry.redis.hget(keys.session(copy), "seed")
    assert msgspec.json.decode(seed) == [["anc", 0, 4], ["root", 0, 4]]  # root's slices, not a copy of them
    assert registry.redis.llen(keys.session_log(copy)) == 4  # its own turn only
    before = keyspace(registry)
    with pytest.raises(ForkError) as refused:
        bundles.import_bundle(registry, opener(export(registry, "sum")), new_ids=True, under="root")  # long enough
    assert refused.value.code is ErrorCode.INVALID_BUNDLE and "base" in refused.value.message
    assert keyspace(registry) == before


def chain(registry: Registry, n: int) -> None:
    registry.append(registry.create("k-0"), turn(0))
    for i in range(1, n):
        fork(registry, f"k-{i - 1}", f"k-{i}")
        registry.append(f"k-{i}", turn(i))


def test_an_import_killed_midway_resumes_when_run_again(registry: Registry, target: Registry,
                                                        other_server: EmbeddedServer, tmp_path: Path) -> None:
    chain(registry, 1500)
    path = tmp_path / "chain.bundle"
    path.write_bytes(export(registry, "k-0"))
    url = f"redis://127.0.0.1:{other_server.port}/0"
    proc = subprocess.Popen(cli_args(url, "import", str(path)), env=clean_environ(), stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: target.redis.xlen(keys.LIFECYCLE_STREAM) >= 100, 60, "100 sessions imported")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    pipe = target.redis.pipeline(transaction=False)
    for i in range(1500):
        pipe.exists(keys.session(f"k-{i}"))
    landed = sum(pipe.execute())  # the sessions whose record the killed run wrote
    assert proc.returncode == -signal.SIGKILL and 100 <= landed < 1500, landed  # killed midway
    digest = msgspec.json.decode(path.read_bytes().splitlines()[-1])["digest"]
    assert target.redis.hget(keys.bundle_import(digest), "state") == b"started"
    again = subprocess.run(cli_args(url, "import", str(path)), env=clean_environ(), capture_output=True, check=True)
    assert msgspec.json.decode(again.stdout)["written"] == 1500 - landed  # the rest, each once
    assert target.redis.hget(keys.bundle_import(digest), "state") == b"done"
    assert export(target, "k-0") == path.read_bytes()


def test_the_commands_export_and_import_and_answer_errors_in_one_line(registry: Registry, target: Registry,
                                                                      other_server: EmbeddedServer,
                                                                      server: EmbeddedServer,
                                                                      tmp_path: Path) -> None:
    scenario(registry)
    path = tmp_path / "root.bundle"
    source, there = f"redis://127.0.0.1:{server.port}/0", f"redis://127.0.0.1:{other_server.port}/0"
    out = subprocess.run(cli_args(source, "export", "root", "-o", str(path)), env=clean_environ(),
                         capture_output=True, check=True)
    assert msgspec.json.decode(out.stdout) == {"file": str(path), "root": "root", "sessions": 8, "events": 44,
                                               "base": 4}
    assert path.read_bytes() == export(registry, "root")
    whole = subprocess.run(cli_args(source, "export", "leaf", "--lineage", "-o", str(tmp_path / "l.bundle")),
                           env=clean_environ(), capture_output=True, check=True)
    assert msgspec.json.decode(whole.stdout)["root"] == "root" and (tmp_path / "l.bundle").read_bytes() == \
        export(registry, "leaf", "lineage")
    (tmp_path / "l.bundle").unlink()
    out = subprocess.run(cli_args(there, "import", str(path), "--new-ids"), env=clean_environ(),
                         capture_output=True, check=True)
    assert msgspec.json.decode(out.stdout)["written"] == 8
    path.write_bytes(path.read_bytes()[:-20])
    bad = subprocess.run(cli_args(there, "import", str(path)), env=clean_environ(), capture_output=True)
    assert bad.returncode == 1 and bad.stderr.decode().startswith("error: INVALID_BUNDLE: the bundle is truncated")
    assert bad.stderr.count(b"\n") == 1
    missing = subprocess.run(cli_args(source, "export", "nope", "-o", str(tmp_path / "x")), env=clean_environ(),
                             capture_output=True)
    assert missing.returncode == 1 and missing.stderr == b'error: SESSION_NOT_FOUND: session "nope" not found\n'
    assert not (tmp_path / "x").exists() and [p.name for p in tmp_path.iterdir()] == ["root.bundle"]


class Sink(io.RawIOBase):
    """A binary file that keeps only how many bytes it was given."""

    def __init__(self) -> None:
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.size += len(data)
        return len(data)


def test_an_export_holds_a_page_of_events_never_a_log(registry: Registry) -> None:
    registry.create("big")
    for t in range(0, 20_000, 1000):
        registry.append("big", [NewEvent("user/message", {"text": "x" * 200, "n": t + i}) for i in range(1000)])
    sink = Sink()
    tracemalloc.start()
    try:
        bundles.export_bundle(registry, "big", sink)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sink.size > 4_000_000  # the bundle: 20,000 events of ~240 bytes
    assert peak < sink.size / 4, (peak, sink.size)  # a page of 1,000 events and their decoded form
