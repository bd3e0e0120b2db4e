"""Trace context across the queue (W3C ``traceparent``), with OpenTelemetry when it is installed.

A scheduler's client (sync or asyncio) puts the current trace context in the request's
``traceparent`` field; the worker continues it with one span per run of a request,
``sessionfork fork`` (kind CONSUMER), with the attributes ``sessionfork.request_id``,
``sessionfork.source``, ``sessionfork.child_ids``, ``sessionfork.outcome`` (``OK`` or the error
code) and, for a fan-out's refused ids, ``sessionfork.failed_ids``; a ``fork/error`` sets the
span's status to ERROR, described by its code.

Without the ``opentelemetry`` package nothing is imported (it is looked up once, on first use),
requests carry no ``traceparent`` and the worker makes no span; with its API but no SDK tracer
provider set in the worker's process (``trace.set_tracer_provider``), the worker makes no span
either (nothing would record it). The spans go wherever the
process's OpenTelemetry SDK sends them: sessionfork configures no exporter.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from ..core import rules
from ..core.wire import Failure, ForkResult, Outcome
from .outcomes import code_of

SPAN_NAME = "sessionfork fork"


@dataclass(frozen=True)
class _Otel:
    trace: Any  # the opentelemetry.trace module
    propagator: Any  # W3C TraceContextTextMapPropagator


@functools.cache
def _otel() -> _Otel | None:
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return _Otel(trace, TraceContextTextMapPropagator())


def current_traceparent() -> str | UnsetType:
    """The current trace context as a ``traceparent`` (``UNSET``: no OpenTelemetry, or no span)."""
    otel = _otel()
    if otel is None:
        return UNSET
    carrier: dict[str, str] = {}
    otel.propagator.inject(carrier)
    value = carrier.get("traceparent")
    return value if value is not None and rules.is_valid_traceparent(value) else UNSET


class _Fields(msgspec.Struct):
    """What a span needs from a request before it is validated (anything else is ignored)."""

    traceparent: Any = None
    source: Any = None


_fields = msgspec.json.Decoder(_Fields)


class RequestSpan:
    """The span of one run of a request; ``finish`` records the outcome on it."""

    def __init__(self, span: Any = None, otel: _Otel | None = None) -> None:
        self._span, self._otel = span, otel

    @property
    def traced(self) -> bool:
        """Whether this run has a span (OpenTelemetry with an SDK tracer provider)."""
        return self._span is not None

    def finish(self, reply: Outcome) -> None:
        if self._span is None or self._otel is None:
            return
        children: list[str] = []
        if isinstance(reply, ForkResult):
            if not isinstance(reply.session, UnsetType):
                children = [reply.session.id]
            elif not isinstance(reply.sessions, UnsetType):
                children = [h.id for h in reply.sessions]
            if not isinstance(reply.failed, UnsetType):
                self._span.set_attribute("sessionfork.failed_ids", [f.session_id for f in reply.failed])
        self._span.set_attribute("sessionfork.child_ids", children)
        self._span.set_attribute("sessionfork.outcome", code_of(reply))
        if isinstance(reply, Failure):
            self._span.set_status(self._otel.trace.Status(self._otel.trace.StatusCode.ERROR, reply.code))


@contextlib.contextmanager
def request_span(payload: str | bytes, request_id: str, *, current: bool = True) -> Iterator[RequestSpan]:
    """A span for one run of the request ``payload`` (a no-op without OpenTelemetry).

    It continues the request's ``traceparent`` when that is valid; otherwise it starts a trace.
    ``current=False``: the span is not made the current one (a batch's requests: their spans open
    and end in any order, one batch's still open while the next begins), and an exception that
    leaves it is recorded on it as ``start_as_current_span`` records one.
    """
    otel = _otel()
    if otel is None or isinstance(otel.trace.get_tracer_provider(), otel.trace.ProxyTracerProvider):
        # No OpenTelemetry, or its API with no SDK's tracer provider set in this process: nothing
        # would record the span (a batch paid a decode and a span per request for it).
        yield RequestSpan()
        return
    try:
        fields = _fields.decode(payload)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        fields = _Fields()
    # No traceparent: a new trace (an empty context), never a child of the span current here (a
    # batch's requests each have their own span, open at once).
    parent = otel.propagator.extract({})
    if isinstance(fields.traceparent, str) and rules.is_valid_traceparent(fields.traceparent):
        parent = otel.propagator.extract({"traceparent": fields.traceparent})
    source = fields.source.get("id") if isinstance(fields.source, dict) else fields.source
    attributes = {"sessionfork.request_id": request_id}
    if source is not None:  # bounded and escaped: the span of a hostile request shows it harmlessly
        attributes["sessionfork.source"] = rules.shown_id(source)
    tracer = otel.trace.get_tracer("sessionfork")
    if current:
        with tracer.start_as_current_span(SPAN_NAME, context=parent, kind=otel.trace.SpanKind.CONSUMER,
                                          attributes=attributes) as span:
            yield RequestSpan(span, otel)
        return
    span = tracer.start_span(SPAN_NAME, context=parent, kind=otel.trace.SpanKind.CONSUMER, attributes=attributes)
    try:
        yield RequestSpan(span, otel)
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        span.end()
