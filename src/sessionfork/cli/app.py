"""The ``sessionfork`` command line (click). An entry point: the only place that reads os.environ.

Every command answers a bad id, a missing session or an unreachable server with one clear line on
stderr and a non-zero exit status, never a traceback. Exit status: 0 ok, 1 an error outcome,
2 bad usage or settings, 3 Redis unreachable, 4 timed out, 5 a file system error.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
import msgspec
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import __version__
from ..core import config, connections
from ..core.errors import ForkError
from ..core.registry import Registry
from ..worker.service import RequestService

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
LOG_LEVELS = click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False)


class Context:
    """What the group's options give every command: settings, and clients made on demand."""

    def __init__(self, settings: config.Settings, console_token: str | None = None) -> None:
        self.settings = settings
        self.console_token = console_token  # SESSIONFORK_CONSOLE_TOKEN: the console's actions
        self._queue: Any = None
        self._registry: Any = None
        self._shards: list[Any] | None = None
        self.resend = True  # the clients' ``resend`` (connections.queue_client): the worker's are False

    def bound_by(self, seconds: float) -> None:
        """Each connection and command of the clients made from now on fails within ``seconds``
        (at least half a second): a command given a time (``health --timeout``, ``wait
        --timeout``) answers by then, a frozen server included."""
        cap = max(seconds, 0.5)
        s = self.settings
        self.settings = msgspec.structs.replace(s, socket_timeout=min(s.socket_timeout, cap),
                                                connect_timeout=min(s.connect_timeout, cap))

    @property
    def registry_url(self) -> str:
        return self.settings.redis_url or "redis://127.0.0.1:6379/0"

    @property
    def queue_urls(self) -> list[str]:
        """Every queue server, in shard order (one without ``SESSIONFORK_QUEUE_URLS``)."""
        return list(self.settings.queue_urls or [self.settings.queue_url or self.registry_url])

    @property
    def queue_url(self) -> str:
        """The one queue server a command uses: the shard ``SESSIONFORK_SHARD`` names, when the
        queue is sharded (``ConfigError`` without it)."""
        urls, shard = self.queue_urls, self.settings.shard
        if shard is None and len(urls) > 1:
            raise config.ConfigError(f"{config.ENV['queue_urls']} lists {len(urls)} shards: give the shard to "
                                     f"serve (--shard or {config.ENV['shard']}, 0 to {len(urls) - 1})")
        return urls[shard or 0]

    def shard_redis(self) -> list[Any]:
        """A client per queue server, in shard order (the served one's is ``queue_redis()``)."""
        if len(self.queue_urls) == 1:
            return [self.queue_redis()]
        if self._shards is None:
            self._shards = [connections.queue_client(self.settings, url, resend=self.resend) for url in self.queue_urls]
        return self._shards

    def registry(self) -> Registry:
        if self._registry is None:
            urls, shard = self.queue_urls, self.settings.shard
            served = urls[0] if len(urls) == 1 else (None if shard is None else urls[shard])
            shared = not self.settings.cluster and served == self.registry_url
            client = self.queue_redis() if shared else connections.registry_client(
                self.settings, self.registry_url, resend=self.resend)
            self._registry = Registry.from_settings(client, self.settings)
        return self._registry  # type: ignore[no-any-return]

    def queue_redis(self) -> Any:
        if self._queue is None:
            self._queue = connections.queue_client(self.settings, self.queue_url, resend=self.resend)
        return self._queue

    def service(self) -> RequestService:
        return RequestService.from_settings(self.registry(), self.queue_redis(), self.settings)


_IMPORTED = time.monotonic()


def started_at() -> float:
    """The ``time.monotonic()`` of this process's start, the interpreter's own start and imports
    included: on Linux from ``/proc/self/stat`` (to the kernel's clock tick, 10 ms), elsewhere (or
    when that is unreadable) this module's import."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):  # no /proc, no CLOCK_BOOTTIME
        return _IMPORTED
    now = time.monotonic()
    return now - age if 0 <= age <= now - _IMPORTED + 60 else _IMPORTED  # a clock that disagrees: not read


def within(deadline: float, what: str, seconds: float, work: Callable[[], T]) -> T:
    """``work()``'s value, or a Redis ``TimeoutError`` naming ``what`` and the ``seconds`` given
    (status 3) at ``deadline`` (``time.monotonic()``), whatever the servers do: the bound of a
    command given a time, where a connection's own time-outs and retries are not enough (hung
    sentinels: each lookup waits its socket time-out per sentinel, then is retried). The work runs
    in a thread the cut leaves behind, as a sync client's call does (``connections.cut_at``)."""
    try:
        return connections.cut_at(deadline, work, f"no answer from {what} within {seconds:g}s")
    except TimeoutError as exc:
        raise RedisTimeoutError(str(exc)) from None


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


class OneLineGroup(click.Group):
    """A click group whose usage errors are one ``error:`` line and exit status 2, like every other
    failure of the CLI (click would print the usage and a hint first)."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no command (click >= 8.2): the help, as click
                exc.show()
            else:
                click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


CONSOLE_TOKEN = "SESSIONFORK_CONSOLE_TOKEN"
"""The variable that holds the console's action token (unset or empty: the console is read-only)."""

FLAGS = {"redis_url": "--redis-url", "queue_url": "--queue-url", "queue_urls": "--queue-urls",
         "cluster": "--cluster", "tls_ca_file": "--tls-ca-file", "queue": "--queue", "reply_channel": "--reply-channel"}
"""The group's flags, by the setting each sets: an error in one names the flag, not its variable."""


def env_help(text: str, field: str) -> str:
    """An option's help naming the variable that sets it too (``[env var: …]``, as click shows it)."""
    return f"{text}  [env var: {config.ENV[field]}]"


def _settings_epilog() -> str:
    """The group's help ends with every other variable the CLI reads, and its default."""
    defaults = config.Settings()
    shown = {**FLAGS, "shard": "--shard", "metrics_address": "--metrics-address"}
    lines = [f"  {var} (default: {_shown(getattr(defaults, field))})" for field, var in config.ENV.items()
             if field not in shown]
    return "\b\nSettings read from the environment only (docs: Configuration):\n" + "\n".join(lines)


def _shown(value: object) -> str:
    return {True: "1", False: "0", None: "unset"}.get(value, str(value)) if isinstance(value, bool | None) \
        else str(value)


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_settings_epilog())
@click.version_option(__version__, "--version", prog_name="sessionfork", message="%(prog)s %(version)s")
@click.option("--redis-url", help=env_help("Registry server URL (default: redis://127.0.0.1:6379/0).", "redis_url"))
@click.option("--queue-url", help=env_help("Queue server URL (default: the registry's).", "queue_url"))
@click.option("--queue-urls", help=env_help("Sharded queue: comma-separated queue server URLs, in shard order.",
                                            "queue_urls"))
@click.option("--cluster/--no-cluster", default=None, help=env_help("The registry is a Redis Cluster (variable: 1).",
                                                                    "cluster"))
@click.option("--tls-ca-file", help=env_help("CA bundle for rediss:// URLs.", "tls_ca_file"))
@click.option("--queue", "queue_name", help=env_help("RQ queue name (default: sessionfork).", "queue"))
@click.option("--reply-channel", help=env_help("Default reply channel (default: sf:replies).", "reply_channel"))
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, queue_url: str | None, queue_urls: str | None,
        cluster: bool | None, tls_ca_file: str | None, queue_name: str | None, reply_channel: str | None) -> None:
    """Fork live AI-agent sessions from a Redis queue."""
    environ = ctx.obj if isinstance(ctx.obj, dict) else {}
    try:
        settings = config.from_environ(environ, flags=FLAGS, redis_url=redis_url, queue_url=queue_url,
                                       queue_urls=queue_urls, cluster=cluster,
                                       tls_ca_file=tls_ca_file, queue=queue_name, reply_channel=reply_channel)
    except config.ConfigError as exc:
        raise click.UsageError(str(exc)) from None  # one ``error:`` line, exit status 2
    ctx.obj = Context(settings, console_token=environ.get(CONSOLE_TOKEN) or None)
