"""`taiji run --ray`'s decisions and refusals (launch/hosts/ray/nodes.py), without a Ray cluster."""

from __future__ import annotations

import socket
import sys

import pytest

from taiji.errors import ConfigError
from taiji.launch.cli import main
from taiji.launch.hosts.ray import nodes as ray_nodes
from taiji.launch.options import RunConfig
from taiji.launch.parser import build_parser


def test_supported_versions_pass_and_others_are_refused_naming_the_extra():
    ray_nodes.check_version("2.60.0")
    ray_nodes.check_version("2.40.1")
    for version in ("2.9.3", "1.13.0", "3.0.0"):
        with pytest.raises(ConfigError, match=r"taiji\[ray\]"):
            ray_nodes.check_version(version)


def test_ray_missing_is_refused_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'taiji\[ray\]'"):
        ray_nodes.import_ray()


def test_an_unreachable_address_is_refused_at_once():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster at 127.0.0.1"):
        ray_nodes.check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        ray_nodes.check_reachable("nocolon")


def test_a_resource_no_node_has_is_named_with_what_the_nodes_have():
    nodes = [
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0}},
        {"Alive": False, "NodeManagerAddress": "10.0.0.9", "Resources": {"CPU": 8.0, "GPU": 8.0}},
    ]
    assert ray_nodes.unfit_reason(nodes, {"CPU": 4.0}) is None
    reason = ray_nodes.unfit_reason(nodes, {"CPU": 2.0, "GPU": 2.0})
    assert reason is not None and "GPU=2" in reason and "10.0.0.1: CPU=4, GPU=0" in reason
    assert "10.0.0.9" not in reason  # a dead node offers nothing


def test_demand_and_hosts_wanted():
    cfg = ray_nodes.RayConfig("auto", cpus_per_worker=2, gpus_per_worker=1)
    assert ray_nodes.node_demand(cfg, 3) == {"CPU": 6, "GPU": 3}
    assert ray_nodes.node_demand(ray_nodes.RayConfig("auto"), 2) == {"CPU": 2}
    run = RunConfig(nproc=2, command=("python",), nproc_per_node=2, max_np=7)
    assert ray_nodes.hosts_wanted(run) == 3  # 8 slots hold 7 workers: this host and 3 others
    assert (
        ray_nodes.hosts_wanted(
            RunConfig(nproc=2, command=("python",), nproc_per_node=1, max_np=4, min_hosts=2, max_hosts=3)
        )
        == 2
    )


def test_ray_flags_parse_and_ray_needs_nproc_per_node(capsys):
    args = build_parser().parse_args(["run", "-np", "1", "--ray", "--", "python", "-c", "pass"])
    assert ray_nodes.config_of(args) == ray_nodes.RayConfig("auto")
    args = build_parser().parse_args(
        ["run", "-np", "1", "--ray", "10.0.0.1:6379", "--ray-gpus-per-worker", "1", "python", "-c", "pass"]
    )
    assert ray_nodes.config_of(args) == ray_nodes.RayConfig("10.0.0.1:6379", 1.0, 1.0)
    assert ray_nodes.config_of(build_parser().parse_args(["run", "-np", "1", "python"])) is None
    assert main(["run", "-np", "1", "--ray", "127.0.0.1:1", "--", "python", "-c", "pass"]) == 2
    assert "--ray needs --nproc-per-node" in capsys.readouterr().err


def test_the_first_gang_is_one_bundle_per_other_host_and_a_marker_pinning_the_launchers_node():
    from taiji.launch.hosts.ray.gang import PIN, gang_bundles

    assert gang_bundles("10.0.0.1", {"CPU": 2.0}, 2) == [{"node:10.0.0.1": PIN}, {"CPU": 2.0}, {"CPU": 2.0}]
    assert gang_bundles(None, {"CPU": 1.0, "GPU": 1.0}, 1) == [{"CPU": 1.0, "GPU": 1.0}]
