"""The first gang of a `taiji run --ray` job: one Ray placement group, all or nothing.

A job that must start on several hosts (``--nnodes MIN``: the launcher waits for them before
its first config) reserves its other hosts' slots in one placement group: one bundle per
host, STRICT_SPREAD (every bundle on a node of its own), bundle 0 pinned to the launcher's node
(Ray's ``node:<address>`` resource) so that no other bundle lands there. Ray places the whole
group or none of it, so the job never holds part of a gang while it waits for the rest; a
cluster with an autoscaler sees the pending group as demand and adds nodes for it. Once it is
placed, each bundle's node gets the job's agent actor, inside the bundle. Ray is imported only
by the caller (launch/hosts/ray/nodes.py); this module takes the ``ray`` module as an argument.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

PIN = 0.001  # of the launcher node's `node:<address>` resource: a marker, not a reservation


def gang_bundles(
    launcher_address: str | None, demand: dict[str, float], others: int
) -> list[dict[str, float]]:
    """The group's bundles: the launcher's node (a marker; none where the launcher is not on a Ray
    node) and then ``others`` hosts' demands."""
    pin = [{f"node:{launcher_address}": PIN}] if launcher_address else []
    return pin + [dict(demand) for _ in range(others)]


class Gang:
    """The placement group of a job's first hosts; ``nodes()`` says where its bundles are, once placed."""

    def __init__(
        self, ray: Any, name: str, launcher_address: str | None, demand: dict[str, float], others: int
    ):
        from ray.util.placement_group import placement_group

        self.ray, self.others = ray, others
        self.first = 1 if launcher_address else 0  # the first bundle of another host
        self.group = placement_group(
            gang_bundles(launcher_address, demand, others), strategy="STRICT_SPREAD", name=name
        )
        self._ready = self.group.ready()

    def placed(self) -> bool:
        """Whether Ray has placed every bundle (does not wait)."""
        done, _ = self.ray.wait([self._ready], timeout=0)
        return bool(done)

    def nodes(self) -> dict[int, str]:
        """Bundle index (of another host's bundle) -> the Ray node id it is on now."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(self.group).get("bundles_to_node_id", {})
        return {int(i): node for i, node in table.items() if int(i) >= self.first and node}

    def strategy(self, bundle: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=bundle)

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(self.group)
        except Exception as exc:
            log.warning("could not remove the job's placement group: %s", exc)
