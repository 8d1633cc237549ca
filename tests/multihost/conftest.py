"""The emulated hosts every many-host test runs on (network namespaces, taiji_harness/netns.py), and a
Slurm cluster over three of them (taiji_harness/slurm.py)."""

import os

import pytest

from taiji_harness.netns import EmulatedHosts, unavailable
from taiji_harness.slurm import SlurmCluster
from taiji_harness.slurm import unavailable as slurm_unavailable

WHY_NOT = unavailable()


@pytest.fixture
def hosts3():
    """Three emulated hosts; skipped, with the reason, where namespaces cannot be made."""
    if WHY_NOT:
        pytest.skip(f"no emulated hosts here: {WHY_NOT}")
    with EmulatedHosts(3) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def slurm3(tmp_path_factory):
    """Slurm (munged, slurmctld, a slurmd per host: nodes n0, n1, n2) on three emulated hosts of
    their own, shared by a module's tests; skipped, with the reason, where Slurm, munge or
    namespaces are missing."""
    why = WHY_NOT or slurm_unavailable()
    if why:
        pytest.skip(f"no Slurm cluster here: {why}")
    with EmulatedHosts(3, prefix=f"ts{os.getpid() % 100000}") as hosts:
        cluster = SlurmCluster(hosts, tmp_path_factory.mktemp("slurm"))
        try:
            yield cluster
        finally:
            cluster.close()
