"""Trace context: the scheduler's span and the worker's span share one trace, across processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
from helpers import SETTINGS, clean_environ, make_client, turn
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis import Redis

from sessionfork import NewEvent, Registry
from sessionfork.aio import AsyncClient
from sessionfork.core.wire import ForkFailure
from sessionfork.embedded import EmbeddedServer

TRACED_WORKER = Path(__file__).parent.parent / "data" / "traced_worker.py"


def test_worker_span_continues_the_scheduler_trace(server: EmbeddedServer, redis: Redis, registry: Registry,
                                                   tmp_path: Path) -> None:
    registry.append(registry.create("t-src"), turn(1))
    registry.append(registry.create("t-busy"), [NewEvent("turn/start", {"turn": 1})])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scheduler")
    client = make_client(redis)
    with tracer.start_as_current_span("schedule sync"):
        sync_request = client.request("t-src", session_id="t-child", request_id="t-sync")
        client.submit(sync_request)
        client.submit(client.request("t-busy", request_id="t-open"))
        bad = msgspec.structs.replace(client.request("t-src", request_id="t-bad"), traceparent="00-not-a-trace")
        client.submit(bad)

    async def schedule() -> None:
        async with AsyncClient.from_url(server.url, SETTINGS) as aio:
            with tracer.start_as_current_span("schedule async"):
                await aio.submit(await aio.request("t-src", count=2, request_id="t-aio"))

    asyncio.run(schedule())
    untraced = client.request("t-src", request_id="t-none")  # no current span: no traceparent
    assert untraced.traceparent is msgspec.UNSET
    client.submit(untraced)
    out = tmp_path / "spans.json"
    subprocess.run([sys.executable, str(TRACED_WORKER), str(out), "--redis-url", server.url, "worker", "--burst",
                    "--log-level", "WARNING"], env=clean_environ(), check=True, timeout=120)
    ours = {s.name: s for s in exporter.get_finished_spans()}
    spans = {s["attributes"]["sessionfork.request_id"]: s for s in json.loads(out.read_text())}
    assert set(spans) == {"t-sync", "t-open", "t-bad", "t-aio", "t-none"}

    def continues(span: dict[str, Any], name: str) -> None:
        parent = ours[name].context
        assert span["traceId"] == f"{parent.trace_id:032x}" and span["parentId"] == f"{parent.span_id:016x}"
        assert span["remoteParent"] and span["name"] == "sessionfork fork" and span["kind"] == "CONSUMER"

    continues(spans["t-sync"], "schedule sync")
    assert spans["t-sync"]["attributes"] == {"sessionfork.request_id": "t-sync", "sessionfork.source": "t-src",
                                             "sessionfork.child_ids": ["t-child"], "sessionfork.outcome": "OK"}
    assert spans["t-sync"]["status"] == "UNSET"
    continues(spans["t-open"], "schedule sync")
    assert spans["t-open"]["attributes"]["sessionfork.outcome"] == "OPEN_TURN"
    assert (spans["t-open"]["status"], spans["t-open"]["description"]) == ("ERROR", "OPEN_TURN")
    continues(spans["t-aio"], "schedule async")
    assert len(spans["t-aio"]["attributes"]["sessionfork.child_ids"]) == 2
    # A bad traceparent is INVALID_REQUEST (its span starts a trace); none at all: a new trace.
    assert (spans["t-bad"]["status"], spans["t-bad"]["description"]) == ("ERROR", "INVALID_REQUEST")
    known = {f"{s.context.trace_id:032x}" for s in ours.values()}
    for rid in ("t-bad", "t-none"):
        assert spans[rid]["parentId"] is None and spans[rid]["traceId"] not in known
    refused = client.wait(bad, timeout=5)
    assert isinstance(refused, ForkFailure) and refused.code == "INVALID_REQUEST" and "traceparent" in refused.message
    assert client.wait(sync_request, timeout=5).ok


def test_without_opentelemetry_nothing_is_imported_and_requests_are_unchanged() -> None:
    code = """
import sys
sys.modules["opentelemetry"] = None  # as if the package were not installed
from redis import Redis
from sessionfork.aio import AsyncClient
from sessionfork.core import wire
from sessionfork.protocol import tracing
from sessionfork.clients.client import Client
request = Client(Redis(port=1)).request("a", request_id="r1")
with tracing.request_span(b'{"source":"a","traceparent":"00-TRACE-SPAN-01"}', "r1") as span:
    span.finish(wire.ForkFailure(request_id="r1", code="OPEN_TURN", message="m"))
print(wire.encode(request).decode())
print(sorted(m for m, mod in sys.modules.items() if m.startswith("opentelemetry") and mod is not None))
""".replace("TRACE", "1" * 32).replace("SPAN", "2" * 16)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines() == ['{"source":"a","requestId":"r1"}', "[]"]


def test_with_the_api_but_no_sdk_tracer_provider_the_worker_makes_no_span() -> None:
    """In a process of its own: first no provider set (the API's proxy), then an SDK one."""
    code = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from sessionfork.protocol import tracing
payload = b'{"source":"a","traceparent":"00-TRACE-SPAN-01"}'
with tracing.request_span(payload, "r1") as span:
    print(span.traced)
trace.set_tracer_provider(TracerProvider())
with tracing.request_span(payload, "r1") as span:
    print(span.traced)
""".replace("TRACE", "1" * 32).replace("SPAN", "2" * 16)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env=clean_environ())
    assert out.stdout.splitlines() == ["False", "True"]


def test_a_retried_request_is_one_span_per_run(server: EmbeddedServer, redis: Redis, registry: Registry,
                                               tmp_path: Path) -> None:
    # No replica exists: every run creates (or finds) the child, then WAIT fails and RQ retries;
    # two retries are three runs of the request: three spans, one trace (the scheduler's).
    registry.append(registry.create("t-src"), turn(1))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = make_client(redis, retries=2)
    with provider.get_tracer("scheduler").start_as_current_span("schedule"):
        request = client.request("t-src", session_id="t-kid", request_id="t-retried")
    client.submit(request)
    out = tmp_path / "spans.json"
    subprocess.run([sys.executable, str(TRACED_WORKER), str(out), "--redis-url", server.url, "worker", "--burst",
                    "--log-level", "ERROR"], timeout=120, check=True,
                   env=clean_environ(SESSIONFORK_WAIT_REPLICAS=1, SESSIONFORK_WAIT_TIMEOUT_MS=20,
                                     SESSIONFORK_RETRIES=2))
    runs = [s for s in json.loads(out.read_text()) if s["attributes"]["sessionfork.request_id"] == "t-retried"]
    assert len(runs) == 3  # one span per run: neither one for all, nor one per step
    assert len({s["spanId"] for s in runs}) == 3
    (scheduled,) = exporter.get_finished_spans()
    assert {(s["traceId"], s["parentId"]) for s in runs} == {
        (f"{scheduled.context.trace_id:032x}", f"{scheduled.context.span_id:016x}")}
    assert [s["status"] for s in runs] == ["ERROR"] * 3  # two raised (retried), the last ended INTERNAL
    assert runs[-1]["attributes"].get("sessionfork.outcome") == "INTERNAL", runs[-1]["attributes"]
    assert "sessionfork.outcome" not in runs[0]["attributes"]
    reply = client.wait(request, timeout=5)
    assert isinstance(reply, ForkFailure) and reply.code == "INTERNAL"
