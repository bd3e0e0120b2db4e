"""The console's web app (Starlette): server-side HTML from Jinja2 templates, autoescaped, and
one small static script for the live view's server-sent events (no build step).

Pages: ``/`` live outcomes (filter by code, op, source; counts and latency percentiles per code
over a window), ``/search?q=<id>`` a request or a session by id, ``/workers`` workers, queue depth
and pause state per shard with the audit trail; ``/events`` the event stream, ``/healthz`` for a
container's healthcheck. The one action, ``POST /shards/<index>/pause`` or ``.../resume``, needs
the token (``Console.token``; none: the console is read-only and refuses every action).

Every Redis call is bounded (``Console.bound`` seconds, its clients' time-outs and
``retries_until``): an unreachable server is a page with an error banner (status 503), never a
traceback. Every page is sent with a Content-Security-Policy that allows no inline script.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs

import jinja2
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from ..core import wire
from ..core.config import Settings
from ..core.connections import retries_until
from ..core.registry import Registry
from ..ops import pauses
from . import reads

T = TypeVar("T")
HERE = Path(__file__).parent
WINDOWS = (60, 300, 900, 3600)
"""The windows (seconds) the stats of the live page may cover."""
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
STATIC = {"console.css": "text/css", "live.js": "text/javascript"}


@dataclass
class Console:
    """What the app reads and acts on: the queue servers in shard order, the registry, the
    settings (queue name), the action token (``None``: read-only) and the bound of each read."""

    shards: list[Any]
    registry: Registry
    settings: Settings
    token: str | None = None
    bound: float = 2.0


def create_app(console: Console) -> Starlette:
    """The console as an ASGI app (serve it with uvicorn)."""
    # Autoescape on for every template, whatever its name: ids and event data are never markup.
    templates = Jinja2Templates(env=jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                                       autoescape=True))
    templates.env.filters["when"] = _when

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
        window = _int(request.query_params.get("window"), 300)
        window = window if window in WINDOWS else 300
        rows = read(lambda: reads.recent(console.shards, keep))
        stats = read(lambda: reads.window_stats(console.shards, window, int(time.time() * 1000)))
        return page(request, "outcomes.html", {"rows": rows, "stats": stats, "filter": keep, "window": window,
                                               "windows": WINDOWS, "query": request.url.query})

    def search(request: Request) -> Response:
        q = request.query_params.get("q", "").strip()
        found_request = found_session = None
        if q:
            found_request = read(lambda: reads.find_request(console.shards, q))
            found_session = read(lambda: reads.find_session(console.registry, q))
        return page(request, "search.html", {"q": q, "request_view": found_request, "session_view": found_session},
                    200 if not q or found_request or found_session else 404)

    def workers(request: Request) -> Response:
        views = read(lambda: reads.shard_views(console.shards, console.settings))
        audit = read(lambda: reads.audit_entries(console.shards))
        return page(request, "workers.html", {"views": views, "audit": audit,
                                              "message": request.query_params.get("done", "")})

    async def act(request: Request) -> Response:
        action = request.path_params["action"]
        index = _int(request.path_params["index"], -1)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        given = form.get("token", [""])[0] or _bearer(request)
        if console.token is None or not hmac.compare_digest(given.encode(), console.token.encode()):
            reason = "actions are disabled: no console token is set" if console.token is None \
                else "refused: a valid console token is needed for this action"
            return page(request, "refused.html", {"reason": reason}, 403)
        if action not in ("pause", "resume") or not 0 <= index < len(console.shards):
            return page(request, "refused.html", {"reason": "no such shard or action"}, 404)
        actor = f"console {request.client.host if request.client else '?'}"
        detail = form.get("reason", [""])[0][:200]
        do = pauses.pause if action == "pause" else pauses.resume
        await run_in_threadpool(read, lambda: do(console.shards[index], actor, detail))
        return RedirectResponse(f"/workers?done={action}d+shard+{index}", status_code=303)

    def events(request: Request) -> Response:
        keep = _filter(request)
        last = read(lambda: reads.newest_ids(console.shards))
        return StreamingResponse(_stream(console, keep, last, read), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return PlainTextResponse("not found", 404)
        return Response((HERE / "static" / name).read_bytes(), media_type=STATIC[name],
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    def unreachable(request: Request, exc: Exception) -> Response:
        return page(request, "refused.html", {"reason": "", "fault": f"Redis unreachable or failing: "
                                              f"{type(exc).__name__}: {exc}"}, 503)

    routes = [Route("/", outcomes), Route("/search", search), Route("/workers", workers),
              Route("/shards/{index}/{action}", act, methods=["POST"]), Route("/events", events),
              Route("/static/{name}", static), Route("/healthz", healthz)]
    return Starlette(routes=routes, exception_handlers={RedisError: unreachable, TimeoutError: unreachable})


def _stream(console: Console, keep: reads.Filter, last: list[str],
            read: Callable[[Callable[[], Any]], Any]) -> Iterator[str]:
    """The live view's server-sent events: ``outcome`` (a row, JSON) as each is stored, ``fault``
    while Redis fails, a comment line every wait without one (keeps proxies from closing it)."""
    yield "event: ready\ndata: {}\n\n"
    block_ms = int(min(500, console.bound * 500))  # a blocked XREAD answers well within the clients' time-out
    while True:
        try:
            rows = read(lambda: reads.following(console.shards, last, block_ms))
        except (RedisError, TimeoutError) as exc:
            yield f"event: fault\ndata: {json.dumps(f'Redis unreachable or failing: {type(exc).__name__}')}\n\n"
            time.sleep(1.0)  # back-off while the server is away
            continue
        sent = False
        for row in rows:
            if keep.keeps(row):
                yield f"event: outcome\ndata: {wire.encode(row).decode()}\n\n"
                sent = True
        if not sent:
            yield ": idle\n\n"


def _filter(request: Request) -> reads.Filter:
    q = request.query_params
    return reads.Filter(code=q.get("code", "").strip(), op=q.get("op", "").strip(), source=q.get("source", "").strip())


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
