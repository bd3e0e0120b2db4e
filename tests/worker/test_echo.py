"""An invalid value is echoed bounded and escaped everywhere it is shown: the
outcome message, the outcome stream, the worker's JSON log line and its span attribute all go
through ``rules.echo`` (at most ``ECHO_LIMIT`` characters of the value, every control or
non-printable character escaped), run by a real worker process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_environ, outcome_entries, stored_outcome
from redis import Redis

from sessionfork.core import rules, wire
from sessionfork.core.config import Settings
from sessionfork.core.wire import ForkFailure
from sessionfork.embedded import EmbeddedServer
from sessionfork.worker import jobs

TRACED_WORKER = Path(__file__).parent.parent / "data" / "traced_worker.py"
HOSTILE = "\x1b[31mred\x1b[0m\r\n\x00\u202egnp.exe\u2028" + "A" * 20_000
BOUND = 4 * rules.ECHO_LIMIT + 40  # echo's documented bound


def _harmless(text: str) -> None:
    """Bounded, and no control or non-printable character of the value got through."""
    assert len(text) <= BOUND + 200, len(text)  # the message's own words around the echo
    assert text.isprintable(), ascii(text)
    assert "A" * (rules.ECHO_LIMIT + 1) not in text


@pytest.mark.parametrize("source", [HOSTILE, {"id": HOSTILE, "instance": "x"}], ids=["id", "live-handle"])
def test_a_hostile_source_is_shown_bounded_and_escaped_everywhere(server: EmbeddedServer, redis: Redis,
                                                                 tmp_path: Path, source: object) -> None:
    rid = "echo-1"
    assert jobs.enqueue(jobs.make_queue(redis, Settings()), json.dumps({"source": source}).encode(), rid,
                        Settings())
    spans_file = tmp_path / "spans.json"
    run = subprocess.run([sys.executable, str(TRACED_WORKER), str(spans_file), "--redis-url", server.url,
                          "worker", "--burst", "--log-format", "json", "--log-level", "INFO"],
                         env=clean_environ(), capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]

    stored = stored_outcome(redis, rid)
    assert stored is not None
    reply = wire.decode_reply(stored)
    assert isinstance(reply, ForkFailure) and reply.code == "INVALID_REQUEST"
    assert reply.message.startswith("invalid source '\\x1b[31mred\\x1b[0m\\r\\n\\x00\\u202egnp.exe\\u2028AAA")
    assert f"…({len(HOSTILE)} chars)" in reply.message
    _harmless(reply.message)
    (entry,) = outcome_entries(redis)
    assert isinstance(entry.reply, ForkFailure) and entry.reply.message == reply.message
    assert len(entry.raw) < 2 * BOUND + 400

    lines = [json.loads(line) for line in run.stderr.decode().splitlines() if line.startswith("{")]
    logged = [line for line in lines if line.get("requestId") == rid]
    assert logged and logged[-1]["code"] == "INVALID_REQUEST"
    assert logged[-1]["source"] == rules.echo(HOSTILE)
    _harmless(logged[-1]["source"])

    (span,) = [s for s in json.loads(spans_file.read_text()) if s["attributes"]["sessionfork.request_id"] == rid]
    assert span["attributes"]["sessionfork.source"] == rules.echo(HOSTILE)
    _harmless(span["attributes"]["sessionfork.source"])


@pytest.mark.parametrize("value", ["ok-id", "", "a\nb", "x" * 1000, "\ud800", b"\xff\x00", 12, [1] * 5000, None])
def test_echo_is_bounded_and_printable_for_any_value(value: object) -> None:
    shown = rules.echo(value)
    assert len(shown) <= BOUND
    assert shown.isprintable()


def test_a_valid_id_is_shown_as_itself() -> None:
    assert rules.shown_id("src-1") == "src-1"
    assert rules.shown_id("bad id\n") == "'bad id\\n'"
