"""One naming scheme: every JSON a user reads names its fields as the wire does
(camelCase): the outcome stream's entries, ``events --json``, ``stats --json``, ``gc --json``,
``diff --json``, ``tree --json``. Entries written with the old names (``request``, ``us``, ``lat``)
still read."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from helpers import turn
from redis import Redis
from waits import outcome_of

from sessionfork import fork
from sessionfork.cli import cli
from sessionfork.core import keys, wire
from sessionfork.core.registry import Registry
from sessionfork.core.retention import Ended, Swept
from sessionfork.core.wire import ForkResult, Header
from sessionfork.embedded import EmbeddedServer
from sessionfork.ops import diff, lineage, stats
from sessionfork.protocol import outcomes
from sessionfork.worker.outcomes import Outcomes

CAMEL = re.compile(r"^[a-z][a-zA-Z0-9]*$")
RECORD_SCRIPT = Path(outcomes.__file__).parents[1] / "worker" / "scripts" / "record.lua"
# Where a user's own data or the outcome codes sit: not field names.
NOT_NAMES = {"codes", "data", "meta"}


def names(value: Any, path: str = "$") -> list[tuple[str, str]]:
    """Every object key in ``value`` (with where it is), but under ``NOT_NAMES``."""
    found = []
    if isinstance(value, dict):
        for key, inner in value.items():
            found.append((path, key))
            if key not in NOT_NAMES:
                found += names(inner, f"{path}.{key}")
    elif isinstance(value, list):
        for inner in value:
            found += names(inner, f"{path}[]")
    return found


def assert_camel(value: Any) -> None:
    bad = [(where, key) for where, key in names(value) if not CAMEL.match(key)]
    assert not bad, bad


def invoke(server: EmbeddedServer, *args: str) -> str:
    done = CliRunner().invoke(cli, ["--redis-url", server.url, *args], obj={})
    assert done.exit_code == 0, done.output
    return done.stdout


def test_the_record_script_writes_the_stream_fields_protocol_names() -> None:
    xadd = re.search(r"'XADD', KEYS\[1\], 'MAXLEN', '~', ARGV\[2\], '\*',\s*(.*?)\)\n", RECORD_SCRIPT.read_text(), re.S)
    assert xadd is not None
    assert tuple(re.findall(r"'(\w+)', (?:ARGV|outcome)", xadd.group(1))) == outcomes.STREAM_FIELDS
    assert all(CAMEL.match(name) for name in outcomes.STREAM_FIELDS)


def test_a_stream_entry_is_written_with_the_camel_case_names(redis: Redis) -> None:
    reply = ForkResult(request_id="r-new", session=Header(version=0, id="c", created_at=1))
    Outcomes(redis, ttl=60, stream_maxlen=100).record(reply, "sf:replies", duration_us=7, latency_us=9)
    ((_, fields),) = redis.xrange(keys.OUTCOME_STREAM)
    assert {wire.text(k): v for k, v in fields.items()} == {
        "requestId": b"r-new", "code": b"OK", "durationUs": b"7", "latencyUs": b"9", "reply": wire.encode(reply)}


def test_an_entry_with_the_old_names_reads_as_a_new_one(server: EmbeddedServer, redis: Redis) -> None:
    reply = ForkResult(request_id="r-old", session=Header(version=0, id="c", created_at=1))
    redis.xadd(keys.OUTCOME_STREAM, {"request": "r-old", "code": "OK", "us": "1500", "lat": "2500",
                                     "reply": wire.encode(reply)})
    redis.xadd(keys.OUTCOME_STREAM, {"request": "r-older", "code": "OK", "reply": wire.encode(reply)})  # no times
    read = outcome_of(lambda: list(stats.read_outcomes(redis)))  # an error's text, when it raises
    assert isinstance(read, list) and len(read) == 2, read
    old, older = read
    assert (old.request_id, old.code, old.duration_us, old.latency_us, old.reply) == ("r-old", "OK", 1500, 2500, reply)
    assert (older.request_id, older.duration_us, older.latency_us) == ("r-older", 0, 0)
    first = json.loads(invoke(server, "outcomes", "--json").splitlines()[0])
    assert (first["requestId"], first["durationUs"], first["latencyUs"]) == ("r-old", 1500, 2500)
    assert stats.compute_stats(redis, 3600, int(old.id.split("-")[0]) + 1000).run_time.p50_ms == 1.5


def test_events_and_stats_json_are_camel_case(server: EmbeddedServer, redis: Redis) -> None:
    reply = ForkResult(request_id="r-1", session=Header(version=0, id="c", created_at=1))
    Outcomes(redis, ttl=60, stream_maxlen=100).record(reply, "sf:replies", duration_us=7, latency_us=9)
    (event,) = [json.loads(line) for line in invoke(server, "outcomes", "--json").splitlines()]
    assert {"requestId", "durationUs", "latencyUs", "code", "reply"} <= set(event)
    assert_camel(event)
    report = json.loads(invoke(server, "stats", "--json"))
    assert {"windowSeconds", "total", "codes", "runTime", "latency"} <= set(report)
    assert set(report["runTime"]) == {"p50Ms", "p90Ms", "p99Ms"}
    assert_camel(report)


def test_diff_and_tree_json_are_camel_case(server: EmbeddedServer, registry: Registry) -> None:
    registry.append(registry.create("n-a"), turn(1))
    fork(registry, "n-a", "n-b")
    fork(registry, "n-a", "n-c")
    registry.append("n-b", turn(2))
    found = json.loads(invoke(server, "diff", "n-b", "n-c", "--json"))
    assert found["ancestor"] == "n-a"
    assert_camel(found)
    assert_camel(json.loads(invoke(server, "tree", "n-a", "--format", "json")))


@pytest.mark.parametrize("struct", [Swept, Ended, diff.Diff, diff.Side, diff.Kept, lineage.Lineage, lineage.Node,
                                    lineage.MergeEdge, stats.Outcome, stats.Stats, stats.Percentiles])
def test_every_field_of_the_json_a_user_reads_is_camel_case(struct: type[msgspec.Struct]) -> None:
    """``gc --json`` prints ``Ended`` and ``Swept``, ``diff --json`` a ``Diff``, ``tree --json`` a ``Lineage``,
    ``events --json`` an ``Outcome`` and ``stats --json`` a ``Stats``."""
    shown = [f.encode_name for f in msgspec.structs.fields(struct)]
    assert [n for n in shown if not CAMEL.match(n)] == [], shown
