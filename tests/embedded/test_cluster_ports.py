"""A cluster node's ports: both below the ephemeral range, and another pair when its bind fails."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sessionfork.embedded import topologies
from sessionfork.embedded.topologies import CLUSTER_PORTS, EmbeddedCluster, free_cluster_port


def test_a_node_and_its_bus_port_are_below_the_ephemeral_range() -> None:
    low, _ = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_cluster_port() for _ in range(50)]
    assert all(CLUSTER_PORTS[0] <= p < CLUSTER_PORTS[1] and p + 10000 < low for p in ports), ports


def test_a_node_whose_bus_port_is_taken_starts_on_another_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = free_cluster_port()
    pairs = iter([taken, free_cluster_port()])
    monkeypatch.setattr(topologies, "free_cluster_port", lambda: next(pairs))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", taken + 10000))  # what a client's outgoing connection did
        holder.listen()
        node = EmbeddedCluster(1)._node()
        try:
            assert node.port != taken
            with node.client() as c:
                assert c.ping()
        finally:
            node.close()
