"""The queue-side commands: worker, fork, health, demo (registered on ``cli``)."""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any

import click
import msgspec

from ..clients.client import Client
from ..core import config, rules, wire
from ..protocol.requests import MAX_WAIT, ForkOptions
from ..worker import jobs
from .app import LOG_LEVELS, Context, clean_errors, cli, env_help, started_at, within
from .files import read_edits, read_summary, read_variants

log = logging.getLogger("sessionfork.worker")


def _check_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return None if value is None else config.check_address(value, "--metrics-address")
    except config.ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def check_wait(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0 <= value <= MAX_WAIT:  # NaN fails too
        raise click.BadParameter(f"expected 0 to {MAX_WAIT} seconds, got {value}", ctx, param)
    return value


@cli.command()
@click.option("--burst", is_flag=True, help="Quit when the queue is empty.")
@click.option("--name", help="Worker name (default: RQ's).")
@click.option("--max-jobs", type=click.IntRange(min=1), help="Quit after this many jobs.")
@click.option("--log-level", type=LOG_LEVELS, default="INFO", show_default=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object per line, with request id, source, child, code, duration.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), help="Serve Prometheus metrics on this port.")
@click.option("--metrics-address", callback=_check_address, metavar="ADDRESS",
              help=env_help("Serve the metrics on this address (default: 0.0.0.0, every IPv4 one).",
                            "metrics_address"))
@click.option("--shard", type=int, help=env_help("Sharded queue: the shard to serve, 0-based.", "shard"))
@click.pass_obj
@clean_errors
def worker(obj: Context, burst: bool, name: str | None, max_jobs: int | None, log_level: str,
           log_format: str, metrics_port: int | None, metrics_address: str | None, shard: int | None) -> None:
    """Run a fork worker until SIGTERM (finishes the fork in hand, then exits 0)."""
    from ..ops.metrics import Observer, configure_logging
    from ..ops.pauses import is_paused
    from ..worker.request_worker import RequestWorker
    from ..worker.shard_check import check_shard

    configure_logging(log_format, log_level.upper())
    obj.settings = s = config.with_shard(obj.settings, shard, "--shard")
    url, count = obj.queue_url, len(obj.queue_urls)
    obj.resend = False  # a step whose connection dropped runs again whole (connections.queue_client)
    service = obj.service()
    queue_redis = service.outcomes.redis
    queue_redis.ping()
    check_shard(queue_redis, s.shard or 0, count, url)
    queue = jobs.make_queue(queue_redis, s)
    observer = Observer(queue_depth=lambda: queue.count, shard=None if count == 1 else s.shard,
                        paused=lambda: is_paused(queue_redis), prometheus=metrics_port is not None)
    if metrics_port is not None:
        observer.serve(metrics_port, metrics_address or s.metrics_address)
    log.info("worker started", extra={"server": config.redacted(url), "queue": s.queue, "shard": s.shard or 0,
                                      "shards": count, "metricsPort": metrics_port,
                                      "registry": config.redacted(obj.registry_url)})
    fork_worker = RequestWorker([queue], service=service, connection=queue_redis, on_outcome=observer,
                             abandoned_after=s.abandoned_after, job_ttl=s.job_ttl, retention=s.retention,
                             branch_ttl=s.branch_ttl, batch=s.batch,
                             delete_after_persist=s.delete_after_persist,
                             maintenance_interval=s.maintenance_interval,
                             worker_ttl=s.worker_ttl, name=name)
    fork_worker.work(burst=burst, max_jobs=max_jobs, logging_level=log_level.upper())
    if not (burst or max_jobs or fork_worker.stop_signalled):
        # RQ's loop ends on an unexpected error after logging it: say so with a failing status,
        # so that a supervisor (systemd, compose's restart policy) starts the worker again.
        click.echo("error: the worker loop stopped unexpectedly (see the log above)", err=True)
        sys.exit(1)


@cli.command()
@click.argument("source")
@click.option("--instance", help="Fork only this live instance of SOURCE (a live handle).")
@click.option("--session-id", help="The child's id (default: generated).")
@click.option("--session-ids", help="Fan-out: comma-separated child ids.")
@click.option("--count", type=int, help="Fan-out: this many children with generated ids.")
@click.option("--boundary", type=int,
              help="Fork at this inclusive event seq (default: the end of the log).")
@click.option("--if-length", type=click.IntRange(min=0),
              help="Fork only if SOURCE's log has exactly this many events (else PRECONDITION_FAILED).")
@click.option("--edits", "edits_file", type=click.File("rb"),
              help='JSON file (- for stdin): events [{"type", "data", ...}] appended to each child after its seed.')
@click.option("--variants", "variants_file", type=click.File("rb"),
              help='JSON file (- for stdin): [{"sessionId"?, "edits"?}], one child each, from one snapshot.')
@click.option("--summary", "summary_file", type=click.File("rb"),
              help='JSON file (- for stdin): {"keepFrom": K, "data": ...}: each child starts with a session/summary '
                   "event, then SOURCE's events K... renumbered from 1.")
@click.option("--request-id", help="Idempotency key (default: generated).")
@click.option("--reply-to", help="Reply channel for this request.")
@click.option("--wait", "wait_s", type=float, default=10.0, show_default=True, callback=check_wait, metavar="SECONDS",
              help=f"Seconds to wait for the reply (0-{MAX_WAIT}); 0 = enqueue only and print the request id.")
@click.pass_obj
@clean_errors
def fork(obj: Context, source: str, instance: str | None, session_id: str | None, session_ids: str | None,
         count: int | None, boundary: int | None, if_length: int | None, edits_file: IO[bytes] | None,
         variants_file: IO[bytes] | None, summary_file: IO[bytes] | None, request_id: str | None,
         reply_to: str | None, wait_s: float) -> None:
    """Enqueue a fork of SOURCE and print the reply event as JSON (exit 1 on an error code).

    No reply within --wait: exit 4, and the request stays queued: `sessionfork wait REQUEST_ID`
    waits for it again."""
    edits = None if edits_file is None else read_edits(edits_file, "--edits")
    variants = None if variants_file is None else read_variants(variants_file)
    summary = None if summary_file is None else read_summary(summary_file)
    client = Client(obj.shard_redis(), obj.settings)
    src: str | wire.LiveHandle = wire.LiveHandle(source, instance) if instance else source
    options: ForkOptions = {"session_id": session_id, "session_ids": session_ids.split(",") if session_ids else None,
                            "count": count, "request_id": request_id, "reply_to": reply_to, "boundary": boundary,
                            "if_length": if_length, "edits": edits, "variants": variants, "summary": summary}
    send(client, client.request(src, **options), wait_s)


def send(client: Client, request: wire.AnyRequest, wait_s: float) -> None:
    """Enqueue ``request`` and print its reply event as JSON (``print_reply``), within ``wait_s``
    seconds; ``wait_s`` 0: enqueue only, and print the request id. ``fork``'s, ``merge``'s and
    ``select``'s one way to send."""
    if wait_s == 0:
        click.echo(wire.encode({"requestId": client.submit(request), "queued": True}).decode())
        return
    try:
        reply = client.run_request(request, wait_s)  # subscribed, enqueued and answered within --wait
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}: the request stays queued; wait for its reply with: "
                           f"sessionfork wait {request.request_id}") from None
    print_reply(reply)


def print_reply(reply: wire.Outcome) -> None:
    click.echo(wire.encode(reply).decode())
    sys.exit(0 if reply.ok else 1)


@cli.command("wait")
@click.argument("request_id")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True, callback=check_wait,
              metavar="SECONDS",
              help=f"Seconds to wait for the reply (0-{MAX_WAIT}); 0 = only read the outcome stored now.")
@click.option("--reply-to", help="The reply channel the request named (default: the reply channel).")
@click.pass_obj
@clean_errors
def wait(obj: Context, request_id: str, timeout_s: float, reply_to: str | None) -> None:
    """Wait for the outcome of a request enqueued before (`fork --wait 0`, a scheduler, a timed-out
    `fork`) and print its reply event as JSON, as `fork` does (exit 1 on an error code, 4 when
    no reply comes within --timeout: it is queued or running). An id the queue server does not
    know (not queued, running nor answered) is exit 1 at once: REQUEST_NOT_FOUND on stderr."""
    from ..core.connections import retries_until

    obj.bound_by(timeout_s)
    client = Client(obj.shard_redis(), obj.settings)
    deadline = time.monotonic() + timeout_s
    with retries_until(deadline):  # an unreachable server is exit 3 within --timeout, not a silent wait
        client.shards[client.shard_of(rules.check_request_id(request_id, "request id"))].ping()
    try:
        reply = client.wait(request_id, max(deadline - time.monotonic(), 0.0), reply_to=reply_to)
    except TimeoutError:
        raise TimeoutError(f"no reply to request {request_id} within {timeout_s}s: it is queued or running; "
                           f"wait again with: sessionfork wait {request_id}") from None
    print_reply(reply)


EXIT_TIME = 0.25
"""Seconds of ``health --timeout`` kept for printing its answer and the interpreter's exit."""
MIN_WORK = 1.0
"""Seconds ``health`` gives its Redis work at least, when the interpreter's start took its time."""


@cli.command()
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 3600), default=3.0, show_default=True,
              metavar="SECONDS",
              help="Seconds within which it answers, counted from the command's start (the "
                   "interpreter's start included): an unreachable server is exit 3 by then (each "
                   "connection and command bounded by it, no retry past it).")
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object: {"ok", "queue", "shards": [{"shard", "ok", "workers", "paused"}]}.')
@click.pass_obj
@clean_errors
def health(obj: Context, timeout_s: float, as_json: bool) -> None:
    """Exit 0 when a worker of the queue (of every shard, when sharded; of the one SESSIONFORK_SHARD
    names, when set) has a fresh heartbeat, 1 otherwise. A paused shard is shown (a "paused:"
    line), not unhealthy."""
    from ..core.connections import retries_until
    from ..ops.pauses import is_paused
    from ..worker.jobs import fresh_workers

    s = obj.settings
    # The interpreter's start counts: the answer comes within --timeout of the command's start
    # (EXIT_TIME kept for printing it and exiting), the Redis work given MIN_WORK at least.
    deadline = max(started_at() + timeout_s - EXIT_TIME, time.monotonic() + MIN_WORK)
    obj.bound_by(deadline - time.monotonic())

    def look() -> tuple[list[Any], dict[int, list[str]], set[int]]:
        with retries_until(deadline):
            shards = obj.shard_redis()
            asked = [(index, redis) for index, redis in enumerate(shards)
                     if obj.settings.shard is None or index == obj.settings.shard]  # a shard's own
            return (shards, {index: sorted(fresh_workers(redis, obj.settings)) for index, redis in asked},
                    {index for index, redis in asked if is_paused(redis)})

    # Bounded as a whole too: a hung sentinel answers no connection or command time-out.
    shards, found, paused = within(deadline, "the queue server", timeout_s, look)
    if as_json:
        click.echo(wire.encode({"ok": all(found.values()), "queue": s.queue, "shards": [
            {"shard": index, "ok": bool(names), "workers": names, "paused": index in paused}
            for index, names in found.items()]}).decode())
    for index, names in found.items() if not as_json else ():
        where = f"queue {s.queue!r}" + (f" of shard {index}" if len(shards) > 1 else "")
        if names:
            shown = f"{where}: " if len(shards) > 1 else ""  # one server: the line as before sharding
            click.echo(f"ok: {shown}{len(names)} worker(s): {', '.join(names)}")
        else:
            click.echo(f"unhealthy: no worker with a fresh heartbeat on {where}", err=True)
        if index in paused:  # healthy or not: a paused queue takes no job until resumed
            click.echo(f"paused: {where}: its workers take no new job (resume it in the console, or rq resume)")
    if not all(found.values()):
        sys.exit(1)


@cli.command()
@click.option("--redis-url", "demo_url", help="Use this server instead of starting an embedded one.")
@click.pass_obj
@clean_errors
def demo(obj: Context, demo_url: str | None) -> None:
    """Walk through every outcome on an embedded server (or --redis-url), then stop what it started."""
    from .demo import DemoFailed, run_demo

    settings = obj.settings if demo_url is None else msgspec.structs.replace(obj.settings, redis_url=demo_url)
    try:
        run_demo(settings, echo=click.echo)
    except DemoFailed as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


