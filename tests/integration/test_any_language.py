"""The README's any-language recipe works: raw Redis commands submit a fork and get its reply."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from redis import Redis

from sessionfork import NewEvent, Registry
from sessionfork.embedded import EmbeddedServer

PRODUCER = Path(__file__).parent.parent / "data" / "raw_producer.py"


def test_raw_redis_producer_gets_its_fork_reply(server: EmbeddedServer, redis: Redis, registry: Registry) -> None:
    handle = registry.create("raw-src")
    registry.append(handle, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1})])
    running = registry.create("raw-running")
    registry.append(running, [NewEvent("turn/start", {"turn": 1}), NewEvent("turn/end", {"turn": 1}),
                              NewEvent("turn/start", {"turn": 2})])
    worker = subprocess.Popen([sys.executable, "-m", "sessionfork", "--redis-url", server.url, "worker",
                               "--name", "raw-worker", "--log-level", "WARNING"])
    try:
        out = subprocess.run([sys.executable, str(PRODUCER), str(server.port), "raw-src", "raw-child", "raw-1"],
                             capture_output=True, text=True, timeout=60, check=True)
        at = subprocess.run([sys.executable, str(PRODUCER), str(server.port), "raw-running", "raw-at", "raw-2", "1"],
                            capture_output=True, text=True, timeout=60, check=True)
    finally:
        worker.terminate()
        worker.wait(30)
    reply = json.loads(out.stdout)
    assert reply == {"type": "fork/result", "requestId": "raw-1", "ok": True,
                     "session": {**reply["session"], "id": "raw-child", "parentSession": "raw-src", "seedLength": 2}}
    assert registry.header("raw-child").parent_session == "raw-src"
    # With "boundary": a running session forks at its completed turn.
    reply = json.loads(at.stdout)
    assert reply == {"type": "fork/result", "requestId": "raw-2", "ok": True,
                     "session": {**reply["session"], "id": "raw-at", "parentSession": "raw-running", "seedLength": 2}}


def test_raw_producer_imports_neither_rq_nor_sessionfork() -> None:
    tree = ast.parse(PRODUCER.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"json", "sys", "time", "redis"}
