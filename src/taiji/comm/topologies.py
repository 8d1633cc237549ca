"""The names of the grad channel's allreduce plans (comm/topology.py builds them), checkable
without torch (the launcher checks ``--topology`` before it imports torch)."""

from __future__ import annotations

from ..errors import ConfigError

TOPOLOGIES = ("ring", "tree", "star", "hierarchical")


def check_topology(name: str) -> str:
    """``name`` if it names a plan; else a ConfigError listing them."""
    if name not in TOPOLOGIES:
        raise ConfigError(f"unknown topology {name!r}; use one of {list(TOPOLOGIES)}")
    return name
