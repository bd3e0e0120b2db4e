"""Throwaway topologies of several servers: a Redis Cluster (``EmbeddedCluster``) and a Sentinel-watched
primary with replicas (``EmbeddedSentinel``), built from ``server.EmbeddedServer`` nodes."""

from __future__ import annotations

import random
import socket
from types import TracebackType

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from .server import EmbeddedServer, ServerNotAvailable, find_server_binary, wait_until

CLUSTER_PORTS = (10000, 22000)
"""Where ``free_cluster_port`` picks a node's port ``p``: ``p`` and its bus port ``p + 10000`` both
below Linux's ephemeral range (32768-60999), so no client's outgoing connection can take either
between the check and the node's bind (with busy tests, one did: the node exited at start)."""
START_ATTEMPTS = 5
"""How many ports a cluster node tries before its start fails (another process may bind a checked
port first)."""


def free_cluster_port(rng: random.Random | None = None) -> int:
    """A free port ``p`` with ``p + 10000`` free too (a cluster node's bus port), in ``CLUSTER_PORTS``."""
    pick = rng or random.Random()
    for _ in range(200):
        port = pick.randrange(*CLUSTER_PORTS)
        try:
            for candidate in (port, port + 10000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise ServerNotAvailable("no free port pair for a cluster node")



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

    def node_args(self) -> list[str]:
        """More server arguments for every node (none here)."""
        return []

    def _node(self) -> EmbeddedServer:
        """A started node on a free port pair; another port when its bind fails (``START_ATTEMPTS``)."""
        for attempt in range(START_ATTEMPTS):
            port = free_cluster_port()
            node = EmbeddedServer(binary=self.binary, port=port, extra_args=[
                "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms), "--cluster-require-full-coverage", "no",
                "--appendonly", "yes", "--appendfsync", "always", *self.node_args()])
            try:
                return node.start()
            except ServerNotAvailable as exc:
                node.close()
                if "in use" not in str(exc) or attempt == START_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    @property
    def nodes(self) -> list[EmbeddedServer]:
        """Every node: the masters, then the replicas."""
        return [*self.masters, *self.replicas]

    @property
    def url(self) -> str:
        """The URL of one running node (cluster clients discover the others from it)."""
        live = [n for n in self.nodes if n.process is not None and n.process.poll() is None]
        return live[0].url

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        """Start every node and join them into a cluster; returns once it is ready (within
        ``timeout`` seconds). A failure closes what was started."""
        try:
            return self._start(timeout)
        except BaseException:
            self.close()  # no node of a half-started cluster is left running
            raise

    def _start(self, timeout: float) -> EmbeddedCluster:
        masters, replicas = self._shape
        for _ in range(masters):
            self.masters.append(self._node())
        for _ in range(masters * replicas):
            self.replicas.append(self._node())
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
        """Close every node (``EmbeddedServer.close``)."""
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
        """The ``redis+sentinel://`` URL naming every sentinel and the monitored service, database 0."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self, timeout: float = 30.0) -> EmbeddedSentinel:
        """Start the primary, its replicas and the sentinels; returns once the sentinels monitor
        the primary (within ``timeout`` seconds). A failure closes what was started."""
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
        """Close the sentinels, the primary and the replicas."""
        for node in [*self.sentinels, self.primary, *self.replicas]:
            node.close()

    def __enter__(self) -> EmbeddedSentinel:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
