"""A ``sessionfork`` process with the OpenTelemetry SDK and its in-memory exporter.

Usage: python traced_worker.py SPANS.json SESSIONFORK-ARGS...  (e.g. ``--redis-url URL worker --burst``)
When the command ends, the spans it finished are written to SPANS.json (ids as W3C hex).
"""

import json
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from sessionfork.cli import main  # noqa: E402 - after the SDK is set up

out = Path(sys.argv[1])
sys.argv = ["sessionfork", *sys.argv[2:]]
try:
    main()
finally:
    spans = [{
        "name": s.name, "kind": s.kind.name,
        "traceId": f"{s.context.trace_id:032x}", "spanId": f"{s.context.span_id:016x}",
        "parentId": f"{s.parent.span_id:016x}" if s.parent else None,
        "remoteParent": bool(s.parent and s.parent.is_remote),
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in (s.attributes or {}).items()},
        "status": s.status.status_code.name, "description": s.status.description,
    } for s in exporter.get_finished_spans()]
    out.write_text(json.dumps(spans))
