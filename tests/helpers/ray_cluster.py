"""A real Ray cluster on this machine for the tests: a head with no CPUs (it schedules, it
runs no actor) and worker nodes of one CPU each, every node's address 127.0.0.1."""

from __future__ import annotations

import os
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # never report usage from a test
# a cluster of this machine alone: Ray keeps 127.0.0.1, rather than connect to the outward address
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

NODE = {"node_ip_address": "127.0.0.1", "include_dashboard": False}


class LoopbackCluster:
    def __init__(self, workers: int = 2, object_store: int = 200 << 20) -> None:
        from ray.cluster_utils import Cluster

        self.object_store = object_store
        self.cluster = Cluster(initialize_head=True, shutdown_at_exit=True,
                               head_node_args={**NODE, "num_cpus": 0, "object_store_memory": object_store})
        self.workers: list = []
        for _ in range(workers):
            self.add_worker()

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_worker(self):
        node = self.cluster.add_node(**NODE, num_cpus=1, object_store_memory=self.object_store)
        self.workers.append(node)
        self.cluster.wait_for_nodes()
        return node

    def remove_worker(self, node) -> None:
        """The node gone at once, as a machine that died: its raylet and workers killed."""
        self.workers.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def ensure_workers(self, n: int) -> None:
        """Back to n worker nodes, after a test removed some (and wait out the dead ones'
        actors, which hold no CPU once their node is gone)."""
        while len(self.workers) < n:
            self.add_worker()
        time.sleep(0.5)

    def shutdown(self) -> None:
        self.cluster.shutdown()
