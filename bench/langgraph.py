"""LangGraph checkpointers side by side: ``python -m bench.langgraph [--quick] [--out DIR]`` (also the
last part of ``python3 run.py bench``).

``SessionforkSaver`` on an embedded server, beside LangGraph's own ``SqliteSaver`` (a file in a
temporary folder) and ``PostgresSaver`` (Debian's PostgreSQL at 127.0.0.1:5432, database ``test``,
trust auth: started with ``pg_ctlcluster`` when it does not answer; its three tables emptied first),
each through its sync methods, in this one process, one after the other:

* **put/s**: ``steps`` puts on a fresh thread, each the child of the one before, each changing two
  channels (an int and a 200-character text), timed end to end;
* **get/s**: ``gets`` ``get_tuple`` calls of that thread's newest checkpoint, by the saver that
  wrote it; **first get**: one by a new saver (a new connection; sessionfork's reads the log once);
* **copy_thread**: a copy of a 10-step and of a ``long``-step thread (each step with one pending
  write) into a new thread, the fastest of ``COPIES`` (a peer's ``long`` copy: one, of a minute or
  more). Neither peer implements ``copy_thread``
  (``BaseCheckpointSaver``'s raises ``NotImplementedError``): theirs is the copy a user writes,
  ``list`` oldest first and one ``put`` and ``put_writes`` per checkpoint;
* **bytes per checkpoint**: what the ``long``-step thread holds, over its checkpoints: Redis
  ``MEMORY USAGE`` of the session's keys, SQLite's pages, Postgres's ``pg_total_relation_size`` of
  its tables, each grown by that thread alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions, Checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from redis import Redis

from sessionfork.core import keys
from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer
from sessionfork.integrations.langgraph import SessionforkSaver

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
FULL = {"steps": 2000, "gets": 2000, "long": 10_000}
QUICK = {"steps": 200, "gets": 200, "long": 1000}
TEXT = "x" * 200
COPIES = 3
"""Copies timed of each thread: the fastest is kept."""
Measures = dict[str, float]


def checkpoint(step: int) -> tuple[Checkpoint, ChannelVersions]:
    """Step ``step``'s checkpoint (both channels changed) and its new versions."""
    versions: ChannelVersions = {"step": step + 1, "text": step + 1}
    return Checkpoint(v=4, id=str(uuid6(clock_seq=step)), ts=datetime.now(UTC).isoformat(),
                      channel_values={"step": step, "text": f"{step}{TEXT}"}, channel_versions=versions,
                      versions_seen={"node": {"step": step}}, updated_channels=None), versions


def build(saver: BaseCheckpointSaver[Any], thread_id: str, steps: int, *, writes: bool) -> RunnableConfig:
    """``steps`` checkpoints on a new thread, each the child of the one before (each with one pending
    write when ``writes``); returns the newest's config."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    for step in range(steps):
        cp, versions = checkpoint(step)
        config = saver.put(config, cp, {"source": "loop", "step": step, "parents": {}}, versions)
        if writes:
            saver.put_writes(config, [("step", step + 1)], f"task-{step}", "")
    return config


def copied_by_hand(saver: BaseCheckpointSaver[Any], source: str, target: str) -> None:
    """The copy a user writes for a checkpointer without ``copy_thread``: every checkpoint oldest
    first, with its pending writes."""
    for tup in reversed(list(saver.list({"configurable": {"thread_id": source}}))):
        conf = tup.config["configurable"]
        parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
        into: RunnableConfig = {"configurable": {"thread_id": target, "checkpoint_ns": conf["checkpoint_ns"],
                                                 **({"checkpoint_id": parent} if parent else {})}}
        stored = saver.put(into, tup.checkpoint, tup.metadata, tup.checkpoint["channel_versions"])
        for task, channel, value in tup.pending_writes or []:
            saver.put_writes(stored, [(channel, value)], task)


def seconds(do: Callable[[], object]) -> float:
    start = time.perf_counter()
    do()
    return time.perf_counter() - start


def measure(name: str, saver: BaseCheckpointSaver[Any], fresh: Callable[[], BaseCheckpointSaver[Any]],
            size: Callable[[], int], sizes: dict[str, int]) -> Measures:
    """Every figure of one checkpointer (``fresh`` makes a new saver on the same store; ``size`` is
    what the store holds now, in bytes)."""
    run = uuid.uuid4().hex[:8]

    def copy(source: str, target: str) -> None:
        if isinstance(saver, SessionforkSaver):
            saver.copy_thread(source, target)
        else:
            copied_by_hand(saver, source, target)

    out: Measures = {}
    put_s = seconds(lambda: build(saver, f"puts-{run}", sizes["steps"], writes=False))
    out["put/s"] = sizes["steps"] / put_s
    newest: RunnableConfig = {"configurable": {"thread_id": f"puts-{run}", "checkpoint_ns": ""}}
    get_s = seconds(lambda: [saver.get_tuple(newest) for _ in range(sizes["gets"])])
    out["get/s"] = sizes["gets"] / get_s
    build(saver, f"short-{run}", 10, writes=True)
    out["copy_thread 10 steps (ms)"] = 1000 * min(seconds(partial(copy, f"short-{run}", f"short-{run}-{i}"))
                                                  for i in range(COPIES))
    before = size()
    build(saver, f"long-{run}", sizes["long"], writes=True)
    out["bytes per checkpoint"] = (size() - before) / sizes["long"]
    long_copies = COPIES if isinstance(saver, SessionforkSaver) else 1   # a peer's takes a minute or more
    out[f"copy_thread {sizes['long']:,} steps (ms)"] = 1000 * min(
        seconds(partial(copy, f"long-{run}", f"long-{run}-copy{i}")) for i in range(long_copies))
    long_newest: RunnableConfig = {"configurable": {"thread_id": f"long-{run}", "checkpoint_ns": ""}}
    out[f"first get, new saver, {sizes['long']:,} steps (ms)"] = 1000 * seconds(lambda: fresh().get_tuple(long_newest))
    got = saver.get_tuple({"configurable": {"thread_id": f"long-{run}-copy0", "checkpoint_ns": ""}})
    assert got is not None and got.checkpoint["channel_values"]["step"] == sizes["long"] - 1, name
    print(f"  {name}: done", flush=True)
    return out


def text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


@contextmanager
def sessionfork_peer() -> Iterator[tuple[SessionforkSaver, Callable[[], SessionforkSaver], Callable[[], int]]]:
    with EmbeddedServer() as server:
        redis = Redis(port=server.port)

        def size() -> int:
            total = 0
            for raw in redis.smembers(keys.LANGGRAPH_THREADS):
                thread = text(raw)
                sid = text(redis.get(keys.langgraph_thread(thread)) or b"")
                for key in (keys.langgraph_thread(thread), keys.session(sid), keys.session_log(sid),
                            keys.session_turns(sid), keys.session_children(sid)):
                    total += int(redis.memory_usage(key, samples=0) or 0)
            return total

        yield SessionforkSaver(Registry(redis)), lambda: SessionforkSaver(Registry(Redis(port=server.port))), size
        redis.close()


@contextmanager
def sqlite_peer(folder: Path) -> Iterator[tuple[SqliteSaver, Callable[[], SqliteSaver], Callable[[], int]]]:
    path = folder / "checkpoints.sqlite"
    with ExitStack() as stack:
        saver = stack.enter_context(SqliteSaver.from_conn_string(str(path)))
        saver.setup()

        def fresh() -> SqliteSaver:
            return stack.enter_context(SqliteSaver.from_conn_string(str(path)))

        def size() -> int:
            pages, page = saver.conn.execute("PRAGMA page_count").fetchone()[0], saver.conn.execute(
                "PRAGMA page_size").fetchone()[0]
            return int(pages) * int(page)

        yield saver, fresh, size


def postgres_ready() -> str | None:
    """``None`` once Debian's PostgreSQL answers (started with ``pg_ctlcluster`` if it did not), else why not."""
    if not shutil.which("pg_isready"):
        return "pg_isready not found: Debian's postgresql package is not installed"
    if subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"], check=False).returncode == 0:
        return None
    clusters = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=False).stdout.split()
    if len(clusters) >= 2:
        subprocess.run(["pg_ctlcluster", clusters[0], clusters[1], "start"], check=False)
    for _ in range(50):
        if subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"], check=False).returncode == 0:
            return None
        time.sleep(0.2)
    return "PostgreSQL at 127.0.0.1:5432 does not answer"


@contextmanager
def postgres_peer() -> Iterator[tuple[PostgresSaver, Callable[[], PostgresSaver], Callable[[], int]]]:
    with ExitStack() as stack:
        saver = stack.enter_context(PostgresSaver.from_conn_string(POSTGRES))
        saver.setup()
        conn = saver.conn
        assert isinstance(conn, psycopg.Connection)
        with conn.cursor() as cur:
            cur.execute(f"TRUNCATE {', '.join(POSTGRES_TABLES)}")
            cur.execute(f"VACUUM FULL {', '.join(POSTGRES_TABLES)}")

        def fresh() -> PostgresSaver:
            return stack.enter_context(PostgresSaver.from_conn_string(POSTGRES))

        def size() -> int:
            with conn.cursor() as cur:
                cur.execute("SELECT " + " + ".join(f"pg_total_relation_size('{t}')" for t in POSTGRES_TABLES)
                            + " AS size")
                row = cur.fetchone()
            assert row is not None
            return int(row["size"])

        yield saver, fresh, size


def rows(sizes: dict[str, int]) -> dict[str, Measures]:
    """Every figure of each checkpointer, by name."""
    results: dict[str, Measures] = {}
    with sessionfork_peer() as (saver, fresh, size):
        results["sessionfork"] = measure("sessionfork", saver, fresh, size, sizes)
    with tempfile.TemporaryDirectory() as folder, sqlite_peer(Path(folder)) as (lite, fresh_lite, lite_size):
        results["sqlite"] = measure("sqlite", lite, fresh_lite, lite_size, sizes)
    problem = postgres_ready()
    if problem is None:
        with postgres_peer() as (pg, fresh_pg, pg_size):
            results["postgres"] = measure("postgres", pg, fresh_pg, pg_size, sizes)
    else:
        print(f"  postgres: not measured: {problem}", flush=True)
    return results


def render(results: dict[str, Measures]) -> str:
    names = list(next(iter(results.values())))
    peers = list(results)
    head = ["measure", *(f"{p} (LangGraph's {'SqliteSaver' if p == 'sqlite' else 'PostgresSaver'})"
                         if p != "sessionfork" else "SessionforkSaver" for p in peers)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join([n, *(f"{results[p][n]:,.1f}" for p in peers)]) + " |" for n in names]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.langgraph", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"smaller threads: {QUICK}")
    parser.add_argument("--out", default="bench-results", help="folder of langgraph.json")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    print(f"== LangGraph checkpointers ({sizes}) ==", flush=True)
    results = rows(sizes)
    print(render(results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "langgraph.json").write_text(json.dumps({"sizes": sizes, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
