"""Logs that trace: a real worker's log lines, parsed in both formats (``--log-format
text``: logfmt; ``json``: one object per line). Every outcome line carries the request id, the op,
the source, the children, the code and the duration; every time is RFC 3339 (UTC); the start line
names the server (without its password), the queue, the shard and the metrics port."""

from __future__ import annotations

import json
import queue
import shlex
import subprocess
import threading
from datetime import datetime
from typing import Any

import pytest
from helpers import clean_environ, cli_args, make_client, stop, turn, worker_name
from waits import wait_until

from sessionfork.core.registry import Registry
from sessionfork.embedded import EmbeddedServer, free_port

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)

PASSWORD = "s3cret-never-logged"


def parse_logfmt(line: str) -> dict[str, str]:
    """One logfmt line (``key=value key="quoted value"``) as a dict."""
    return dict(token.split("=", 1) for token in shlex.split(line))


class LogLines:
    """A process's stderr lines, read by a thread of its own, parsed as they come."""

    def __init__(self, proc: subprocess.Popen[str], fmt: str) -> None:
        self.parsed: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        assert proc.stderr is not None
        stream = proc.stderr
        self._fmt = fmt
        self._stream = stream
        self._reader = threading.Thread(target=lambda: [self._lines.put(line) for line in stream], daemon=True)
        self._reader.start()

    def close(self) -> None:
        """Once the process has exited: the rest of its lines read, its pipe closed."""
        self._reader.join(10)
        self._stream.close()

    def seen(self, **fields: object) -> dict[str, Any] | None:
        """The first line so far with these field values, else ``None``."""
        while not self._lines.empty():
            line = self._lines.get().rstrip("\n")
            self.raw.append(line)
            self.parsed.append(json.loads(line) if self._fmt == "json" else parse_logfmt(line))
        return next((p for p in self.parsed if all(p.get(k) == v for k, v in fields.items())), None)


def rfc3339(text: str) -> datetime:
    assert text.endswith("Z") and "T" in text, text  # UTC, RFC 3339's date-time
    return datetime.fromisoformat(text)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_start_line_and_every_outcome_line_trace(fmt: str) -> None:
    with EmbeddedServer() as srv:
        with srv.client() as setup:
            setup.config_set("requirepass", PASSWORD)
        url = f"redis://:{PASSWORD}@127.0.0.1:{srv.port}/0"
        redis = srv.client(password=PASSWORD)
        port = free_port()
        proc = subprocess.Popen([*cli_args(url, "worker", "--name", worker_name("logs"), "--log-format", fmt,
                                           "--metrics-port", str(port))],
                                env=clean_environ(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = LogLines(proc, fmt)
        try:
            wait_until(lambda: lines.seen(event="worker started"), 30, "the worker's start line")
            registry = Registry(redis)
            registry.append(registry.create("logs-src"), turn(1))
            client = make_client(redis)
            ok = client.fork("logs-src", session_id="logs-child", request_id="logs-r1", timeout=20)
            missing = client.fork("nobody", request_id="logs-r2", timeout=20)
            fanned = client.fork("logs-src", session_ids=["logs-f1", "logs-f2"], request_id="logs-r3", timeout=20)
            assert ok.ok and not missing.ok and fanned.ok
            for rid in ("logs-r1", "logs-r2", "logs-r3"):
                wait_until(lambda rid=rid: lines.seen(requestId=rid), 20, f"the outcome line of {rid}")  # type: ignore[misc]
            client.close()
            redis.close()
        finally:
            status = stop(proc)
            lines.close()
        assert status == 0
    assert PASSWORD not in "\n".join(lines.raw)
    start = lines.seen(event="worker started")
    assert start is not None
    expected = {"server": f"redis://:***@127.0.0.1:{srv.port}/0", "queue": "sessionfork", "shard": 0,
                "metricsPort": port}
    if fmt == "text":
        expected = {k: str(v) for k, v in expected.items()}
    assert {k: start.get(k) for k in expected} == expected
    for line in lines.parsed:
        rfc3339(line["time"])
        assert line["level"] in {"debug", "info", "warning", "error", "critical"}, line
    outcomes = {rid: lines.seen(requestId=rid) for rid in ("logs-r1", "logs-r2", "logs-r3")}
    got = {rid: {k: line[k] for k in ("op", "source", "children", "code")} if line else None
           for rid, line in outcomes.items()}
    children = {"logs-r1": ["logs-child"], "logs-r2": [], "logs-r3": ["logs-f1", "logs-f2"]}
    if fmt == "text":
        children = {k: ",".join(v) for k, v in children.items()}  # type: ignore[misc]
    assert got == {
        "logs-r1": {"op": "fork", "source": "logs-src", "children": children["logs-r1"], "code": "OK"},
        "logs-r2": {"op": "fork", "source": "nobody", "children": children["logs-r2"], "code": "SESSION_NOT_FOUND"},
        "logs-r3": {"op": "fork", "source": "logs-src", "children": children["logs-r3"], "code": "OK"}}
    for line in outcomes.values():
        assert line is not None and float(line["durationMs"]) > 0, line
        assert line["event"] == f"fork {line['code']}"
