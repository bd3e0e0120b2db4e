"""The console's web app (Starlette): server-side HTML from Jinja2 templates, autoescaped, and
one small static script for the live overview's server-sent events and chart (no build step).

Pages: ``/`` the live overview (a window's counts, rates, error share and latency percentiles per
code, a chart of its rate and error percentage, the outcomes; filter by code, op, source, errors
only), ``/search?q=<id>`` a request or a session by id, ``/workers`` workers, queue depth and pause
state per shard with the audit trail; ``/events`` the event stream (``feed.Feed``: one reader for
every open view, at most ``Console.live_limit`` of them), ``/healthz`` for a container's
healthcheck (answered on the event loop). The one action, ``POST /shards/<index>/pause`` or
``.../resume``, needs the token (``Console.token``; none: the console is read-only and refuses
every action), checked before the body is read; a body is read up to ``FORM_BYTES``.

Every Redis call is bounded (``Console.bound`` seconds, its clients' time-outs and
``retries_until``): an unreachable server is a page with an error banner (status 503), never a
traceback. Every page is sent with a Content-Security-Policy that allows no inline script.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode

import jinja2
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from ..core import errors, wire
from ..core.config import Settings
from ..core.connections import retries_until
from ..core.registry import Registry
from ..ops import pauses
from ..protocol import operations
from . import reads
from .feed import Feed, Subscription

T = TypeVar("T")
HERE = Path(__file__).parent
WINDOWS = (60, 300, 900, 3600)
"""The windows (seconds) the stats of the live page may cover."""
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
STATIC = {"console.css": "text/css", "live.js": "text/javascript", "workers.js": "text/javascript"}
CODES = ("OK", *sorted(code.value for code in errors.ErrorCode))
"""The outcome codes the filter lists."""
OPS = tuple(operations.OPERATIONS)
FORM_BYTES = 16 * 1024
"""The most of an action's body the console reads (a token and a reason); a longer one is refused (413)."""
IDLE = 10.0
"""Seconds a live view may go without a message before it is sent a comment line."""


@dataclass
class Console:
    """What the app reads and acts on: the queue servers in shard order, the registry, the
    settings (queue name), the action token (``None``: read-only), the bound of each read and
    how many live views may be open."""

    shards: list[Any]
    registry: Registry
    settings: Settings
    token: str | None = None
    bound: float = 2.0
    live_limit: int = 100
    """How many live views (``/events``) may be open at once; one more is answered 503."""


def create_app(console: Console) -> Starlette:
    """The console as an ASGI app (serve it with uvicorn)."""
    # Autoescape on for every template, whatever its name: ids and event data are never markup.
    templates = Jinja2Templates(env=jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                                       autoescape=True))
    templates.env.filters["when"] = _when
    templates.env.filters["rate"] = _rate

    def read(work: Callable[[], T]) -> T:
        with retries_until(time.monotonic() + console.bound):
            return work()

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        shown = {"shards": len(console.shards), "actions": console.token is not None, **context}
        response = templates.TemplateResponse(request, name, shown, status_code=status)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    def outcomes(request: Request) -> Response:
        keep = _filter(request)
        seconds = _int(request.query_params.get("window"), 300)
        seconds = seconds if seconds in WINDOWS else 300
        rows = read(lambda: reads.recent(console.shards, keep))
        shown = read(lambda: reads.window(console.shards, seconds, int(time.time() * 1000), keep.scope()))
        scope = urlencode({k: v for k, v in (("op", keep.op), ("source", keep.source)) if v})
        return page(request, "outcomes.html", {"rows": rows, "window": shown, "filter": keep, "windows": WINDOWS,
                                               "codes": CODES, "ops": OPS, "events": f"/events?{scope}",
                                               "most": f"{reads.WINDOW_MOST:,}",
                                               "window_data": wire.encode(shown).decode()})

    def search(request: Request) -> Response:
        q = request.query_params.get("q", "").strip()
        found_request = found_session = None
        if q:
            found_request = read(lambda: reads.find_request(console.shards, q, console.settings))
            found_session = read(lambda: reads.find_session(console.registry, q))
        return page(request, "search.html", {"q": q, "request_view": found_request, "session_view": found_session},
                    200 if not q or found_request or found_session else 404)

    def workers(request: Request) -> Response:
        views = read(lambda: reads.shard_views(console.shards, console.settings))
        audit = read(lambda: reads.audit_entries(console.shards))
        return page(request, "workers.html", {"views": views, "audit": audit, "now": int(time.time() * 1000),
                                              "message": request.query_params.get("done", "")})

    def refused(request: Request) -> Response:
        reason = "actions are disabled: no console token is set" if console.token is None \
            else "refused: a valid console token is needed for this action"
        return page(request, "refused.html", {"reason": reason}, 403)

    def allowed(given: str) -> bool:
        return console.token is not None and hmac.compare_digest(given.encode(), console.token.encode())

    async def act(request: Request) -> Response:
        # The token before the body: without a token set, or with a wrong bearer token, nothing of
        # the body is read; a form (where a token may be) is read only up to FORM_BYTES.
        bearer = _bearer(request)
        if console.token is None or (bearer and not allowed(bearer)):
            return refused(request)
        body = await _bounded_body(request, FORM_BYTES)
        if body is None:
            return page(request, "refused.html", {"reason": f"refused: an action's form is at most "
                                                  f"{FORM_BYTES // 1024} KiB"}, 413)
        form = parse_qs(body.decode("utf-8", "replace"))
        if not allowed(bearer or form.get("token", [""])[0]):
            return refused(request)
        action = request.path_params["action"]
        index = _int(request.path_params["index"], -1)
        if action not in ("pause", "resume") or not 0 <= index < len(console.shards):
            return page(request, "refused.html", {"reason": "no such shard or action"}, 404)
        actor = f"console {request.client.host if request.client else '?'}"
        detail = form.get("reason", [""])[0][:200]
        do = pauses.pause if action == "pause" else pauses.resume
        await run_in_threadpool(read, lambda: do(console.shards[index], actor, detail))
        return RedirectResponse(f"/workers?done={action}d+shard+{index}", status_code=303)

    feed = Feed(console.shards, read, limit=console.live_limit, block_ms=int(min(500, console.bound * 500)))

    async def events(request: Request) -> Response:
        view = feed.join(_filter(request))
        if view is None:
            return PlainTextResponse(f"too many live views open (at most {console.live_limit})", 503,
                                     headers={"Retry-After": "10"})
        return StreamingResponse(_stream(feed, view), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return PlainTextResponse("not found", 404)
        return Response((HERE / "static" / name).read_bytes(), media_type=STATIC[name],
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})

    async def healthz(request: Request) -> Response:  # on the event loop: no thread to wait for
        return PlainTextResponse("ok")

    def unreachable(request: Request, exc: Exception) -> Response:
        return page(request, "refused.html", {"reason": "", "fault": f"Redis unreachable or failing: "
                                              f"{type(exc).__name__}: {exc}"}, 503)

    routes = [Route("/", outcomes), Route("/search", search), Route("/workers", workers),
              Route("/shards/{index}/{action}", act, methods=["POST"]), Route("/events", events),
              Route("/static/{name}", static), Route("/healthz", healthz)]
    return Starlette(routes=routes, exception_handlers={RedisError: unreachable, TimeoutError: unreachable})


async def _stream(feed: Feed, view: Subscription) -> AsyncIterator[str]:
    """A live view's server-sent events: ``ready`` once every outcome stored from then on will
    come, ``outcome`` (a row, JSON) as each is stored, ``fault`` while Redis fails, ``restored``
    when it answers again, a comment line every ``IDLE`` seconds without one (keeps proxies from
    closing it). The view is closed when the browser goes."""
    try:
        yield ": open\n\n"  # the headers and a first line at once; ``ready`` follows from the reader
        while True:
            try:
                kind, data = await asyncio.wait_for(view.queue.get(), IDLE)
            except TimeoutError:
                yield ": idle\n\n"
                continue
            if kind == "outcome":
                yield f"event: outcome\ndata: {wire.encode(data).decode()}\n\n"
            elif kind == "fault":
                yield f"event: fault\ndata: {json.dumps(data)}\n\n"
            else:  # ready, restored
                yield f"event: {kind}\ndata: {{}}\n\n"
    finally:
        feed.leave(view)


def _filter(request: Request) -> reads.Filter:
    q = request.query_params
    return reads.Filter(code=q.get("code", "").strip(), op=q.get("op", "").strip(), source=q.get("source", "").strip(),
                        errors=q.get("errors", "") not in ("", "0"))


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else ""


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _when(ms: int) -> str:
    """Epoch milliseconds as UTC ``YYYY-MM-DD HH:MM:SS.mmm`` ("-": never)."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


async def _bounded_body(request: Request, most: int) -> bytes | None:
    """The request's body, or ``None`` as soon as it is known to be longer than ``most`` bytes
    (a declared ``Content-Length`` over it: nothing read; else read up to one chunk past it)."""
    declared = request.headers.get("content-length", "")
    if declared and (not declared.isdigit() or int(declared) > most):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > most:
            return None
    return bytes(body)


def _rate(per_second: float) -> str:
    """A rate as the page's script shows it: three decimals under one a second, else one."""
    return f"{per_second:.3f}" if per_second < 1 else f"{per_second:.1f}"
