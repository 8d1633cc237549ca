"""TaijiEnvironment: Lightning's view of a taiji job's cluster, read live.

taiji's launcher (or plain ``python``: one worker) creates the processes; rank and size are those of
the cluster's *current* version (rank 0 is always the oldest worker), so they change when the job
grows, shrinks or loses a worker. Lightning never sets them.
"""

from __future__ import annotations

import os

from lightning.fabric.plugins.environments import ClusterEnvironment

import taiji

from ... import env


class TaijiEnvironment(ClusterEnvironment):
    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get(
            "MASTER_ADDR", "127.0.0.1"
        )  # taiji's store; Lightning opens no group of its own

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return env.WORKER_ID.get() is not None

    def world_size(self) -> int:
        return taiji.size()

    def set_world_size(self, size: int) -> None:
        """The cluster's size is taiji's (it changes while training); Lightning's guess is ignored."""

    def global_rank(self) -> int:
        return taiji.rank()

    def set_global_rank(self, rank: int) -> None:
        """The rank is taiji's (it changes while training); Lightning's guess is ignored."""

    def local_rank(self) -> int:
        return 0  # one worker per device: each worker uses the device Lightning gives it

    def node_rank(self) -> int:
        return 0
