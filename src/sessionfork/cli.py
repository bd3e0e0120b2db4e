"""The ``sessionfork`` command line (click). An entry point: the only place that reads os.environ.

Every command answers a bad id, a missing session or an unreachable server with one clear line on
stderr and a non-zero exit status, never a traceback. Exit status: 0 ok, 1 an error outcome,
2 bad usage or settings, 3 Redis unreachable, 4 timed out, 5 a file system error.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import msgspec
from redis.exceptions import RedisError

from . import config, connections, jobs, wire
from .client import Client
from .errors import ForkError
from .registry import Registry
from .service import ForkService

F = TypeVar("F", bound=Callable[..., Any])


class Context:
    """What the group's options give every command: settings, and clients made on demand."""

    def __init__(self, settings: config.Settings) -> None:
        self.settings = settings
        self._queue: Any = None
        self._registry: Any = None

    @property
    def registry_url(self) -> str:
        return self.settings.redis_url or "redis://127.0.0.1:6379/0"

    @property
    def queue_url(self) -> str:
        return self.settings.queue_url or self.registry_url

    def registry(self) -> Registry:
        if self._registry is None:
            shared = not self.settings.cluster and self.queue_url == self.registry_url
            client = self.queue_redis() if shared else connections.registry_client(self.settings, self.registry_url)
            self._registry = Registry.from_settings(client, self.settings)
        return self._registry  # type: ignore[no-any-return]

    def queue_redis(self) -> Any:
        if self._queue is None:
            self._queue = connections.queue_client(self.settings, self.queue_url)
        return self._queue

    def service(self) -> ForkService:
        return ForkService.from_settings(self.registry(), self.queue_redis(), self.settings)


def clean_errors(fn: F) -> F:
    """Turn expected failures into one line on stderr and an exit status."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ForkError as exc:
            click.echo(f"error: {exc.code.value}: {exc.message}", err=True)
            sys.exit(1)
        except config.ConfigError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except RedisError as exc:
            click.echo(f"error: Redis unreachable or failing: {type(exc).__name__}: {exc}", err=True)
            sys.exit(3)
        except TimeoutError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(4)
        except OSError as exc:  # after TimeoutError, one of its subclasses: e.g. persist's --root
            click.echo(f"error: {exc}", err=True)
            sys.exit(5)

    return wrapper  # type: ignore[return-value]


@click.group()
@click.option("--redis-url", help="Registry server URL (default: $REDIS_URL, else redis://127.0.0.1:6379/0).")
@click.option("--queue-url", help="Queue server URL (default: $SESSIONFORK_QUEUE_URL, else the registry's).")
@click.option("--cluster/--no-cluster", default=None, help="The registry is a Redis Cluster.")
@click.option("--tls-ca-file", help="CA bundle for rediss:// URLs.")
@click.option("--queue", "queue_name", help="RQ queue name (default: sessionfork).")
@click.option("--reply-channel", help="Default reply channel (default: sf:replies).")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, queue_url: str | None, cluster: bool | None,
        tls_ca_file: str | None, queue_name: str | None, reply_channel: str | None) -> None:
    """Fork live AI-agent sessions from a Redis queue."""
    environ = ctx.obj if isinstance(ctx.obj, dict) else {}
    try:
        settings = config.from_environ(environ, redis_url=redis_url, queue_url=queue_url, cluster=cluster,
                                       tls_ca_file=tls_ca_file, queue=queue_name, reply_channel=reply_channel)
    except config.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    ctx.obj = Context(settings)


@cli.command()
@click.option("--burst", is_flag=True, help="Quit when the queue is empty.")
@click.option("--name", help="Worker name (default: RQ's).")
@click.option("--max-jobs", type=int, help="Quit after this many jobs.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object per line, with request id, source, child, code, duration.")
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics on this port.")
@click.pass_obj
@clean_errors
def worker(obj: Context, burst: bool, name: str | None, max_jobs: int | None, log_level: str,
           log_format: str, metrics_port: int | None) -> None:
    """Run a fork worker until SIGTERM (finishes the fork in hand, then exits 0)."""
    from .metrics import Observer, configure_logging
    from .workers import ForkWorker

    configure_logging(log_format, log_level)
    s = obj.settings
    service = obj.service()
    queue_redis = service.outcomes.redis
    queue_redis.ping()
    queue = jobs.make_queue(queue_redis, s)
    observer = Observer(queue_depth=lambda: queue.count)
    if metrics_port is not None:
        observer.serve(metrics_port)
    fork_worker = ForkWorker([queue], service=service, connection=queue_redis, on_outcome=observer,
                             abandoned_after=s.abandoned_after, maintenance_interval=s.maintenance_interval,
                             worker_ttl=s.worker_ttl, name=name)
    fork_worker.work(burst=burst, max_jobs=max_jobs, logging_level=log_level)
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
@click.option("--request-id", help="Idempotency key (default: generated).")
@click.option("--reply-to", help="Reply channel for this request.")
@click.option("--wait", "wait_s", type=float, default=10.0, show_default=True,
              help="Seconds to wait for the reply; 0 = enqueue only and print the request id.")
@click.pass_obj
@clean_errors
def fork(obj: Context, source: str, instance: str | None, session_id: str | None, session_ids: str | None,
         count: int | None, request_id: str | None, reply_to: str | None, wait_s: float) -> None:
    """Enqueue a fork of SOURCE and print the reply event as JSON (exit 1 on an error code)."""
    client = Client(obj.queue_redis(), obj.settings)
    src: str | wire.LiveHandle = wire.LiveHandle(source, instance) if instance else source
    request = client.request(src, session_id=session_id, count=count, request_id=request_id, reply_to=reply_to,
                             session_ids=session_ids.split(",") if session_ids else None)
    request_id = client.submit(request)
    if wait_s <= 0:
        click.echo(wire.encode({"requestId": request_id, "queued": True}).decode())
        return
    reply = client.wait(request, wait_s)
    click.echo(wire.encode(reply).decode())
    sys.exit(0 if reply.ok else 1)


@cli.command()
@click.pass_obj
@clean_errors
def health(obj: Context) -> None:
    """Exit 0 when a worker of the queue has a fresh heartbeat, 1 otherwise."""
    from .workers import fresh_workers

    names = fresh_workers(obj.queue_redis(), obj.settings)
    if not names:
        click.echo(f"unhealthy: no worker with a fresh heartbeat on queue {obj.settings.queue!r}", err=True)
        sys.exit(1)
    click.echo(f"ok: {len(names)} worker(s): {', '.join(sorted(names))}")


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


def main() -> None:
    """Console entry point: settings from the process environment."""

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cli(obj=dict(os.environ), prog_name="sessionfork")


# The operators' commands live in their own module; importing it registers them on ``cli``.
from . import admin  # noqa: E402, F401
