"""`taiji sched serve --ray`: its host pool (launch/sched/ray_pool.py), a Ray node list as
``ray.nodes()`` gives it turned into the scheduler's seats (pure, no Ray); and bad input refused
in one line with exit code 2 (no Ray installed, an unreachable cluster, --ray with --hosts)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from taiji.launch.cli import main as taiji_main
from taiji.launch.sched.ray_pool import node_slots, pool_slots, seat_changes, seat_name, seat_nodes

CPU = {"CPU": 1.0}


def node(address: str, node_id: str, cpus: float = 2.0, alive: bool = True, **extra: float) -> dict:
    return {
        "NodeID": node_id,
        "NodeManagerAddress": address,
        "Alive": alive,
        "Resources": {"CPU": cpus, **extra},
    }


def test_a_nodes_slots_are_what_its_scarcest_resource_holds():
    assert node_slots(node("a", "1", cpus=4), CPU) == 4
    assert node_slots(node("a", "1", cpus=4, GPU=1.0), {"CPU": 1.0, "GPU": 1.0}) == 1
    assert node_slots(node("a", "1", cpus=4), {"CPU": 1.0, "GPU": 1.0}) == 0
    assert node_slots(node("a", "1", cpus=0.3 * 3), {"CPU": 0.3}) == 3  # (no float shortfall)
    assert node_slots(node("a", "1", cpus=1.5), {"CPU": 0.5, "GPU": 0.0}) == 3  # a zero demand is no limit


def test_nodes_take_free_seats_in_order_and_the_rest_are_down():
    pool = seat_nodes((None, None, None), [node("10.0.0.1", "n1"), node("10.0.0.2", "n2")], CPU, 2)
    assert pool.seats == ("10.0.0.1", "10.0.0.2", None)
    assert dict(pool.live) == {0: "n1", 1: "n2"}
    assert seat_changes([None, None, None], pool) == [(0, True), (1, True), (2, False)]
    assert [seat_name(pool.seats, s) for s in range(3)] == ["10.0.0.1", "10.0.0.2", ""]


def test_a_node_added_takes_the_next_seat_and_one_removed_takes_its_seat_down():
    seats = ("10.0.0.1", "10.0.0.2", None)
    grown = seat_nodes(
        seats, [node("10.0.0.1", "n1"), node("10.0.0.2", "n2"), node("10.0.0.3", "n3")], CPU, 2
    )
    assert grown.seats == ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    assert seat_changes([True, True, False], grown) == [(2, True)]
    # node 2's raylet is gone: Ray lists it dead; its seat goes down and stays its own
    shrunk = seat_nodes(
        grown.seats,
        [node("10.0.0.1", "n1"), node("10.0.0.2", "n2", alive=False), node("10.0.0.3", "n3")],
        CPU,
        2,
    )
    assert shrunk.seats == grown.seats and dict(shrunk.live) == {0: "n1", 2: "n3"}
    assert seat_changes([True, True, True], shrunk) == [(1, False)]
    # back at the same address with a new node id: the same host, up again
    back = seat_nodes(
        shrunk.seats,
        [
            node("10.0.0.2", "n2", alive=False),
            node("10.0.0.2", "n2b"),
            node("10.0.0.1", "n1"),
            node("10.0.0.3", "n3"),
        ],
        CPU,
        2,
    )
    assert back.seats == grown.seats and back.live[1] == "n2b"
    assert seat_changes([True, False, True], back) == [(1, True)]


def test_a_node_too_small_or_beyond_the_seats_is_left_out_and_said():
    pool = seat_nodes(
        ("10.0.0.1", None),
        [
            node("10.0.0.1", "n1"),
            node("10.0.0.2", "n2", cpus=1),
            node("10.0.0.3", "n3"),
            node("10.0.0.4", "n4"),
        ],
        CPU,
        2,
    )
    assert pool.seats == ("10.0.0.1", "10.0.0.3")
    assert pool.too_small == ("10.0.0.2",) and pool.unseated == ("10.0.0.4",)
    assert seat_changes([True, True], pool) == []


@pytest.mark.parametrize("cpus, expected", [((4, 2, 8), 2), ((0.5, 3), 3), ((0.5,), 0)])
def test_the_default_slots_are_what_the_smallest_node_holds(cpus, expected):
    nodes = [node(f"10.0.0.{i}", f"n{i}", cpus=c) for i, c in enumerate(cpus)] + [
        node("x", "dead", 1, alive=False)
    ]
    assert pool_slots(nodes, CPU) == expected


def serve(tmp_path, *args: str) -> int:
    return taiji_main(["sched", "serve", "--state-dir", str(tmp_path / "sched"), *args])


def test_ray_and_a_hosts_file_together_are_refused(tmp_path, capsys):
    assert serve(tmp_path, "--ray", "--hosts", str(tmp_path / "hosts.txt")) == 2
    assert "--ray and --hosts" in capsys.readouterr().err


def test_without_ray_installed_the_extra_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    assert serve(tmp_path, "--ray", "127.0.0.1:1") == 2
    assert "pip install 'taiji[ray]'" in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'taiji[ray]')"
)
def test_an_unreachable_cluster_is_refused_naming_it(tmp_path, capsys):
    assert serve(tmp_path, "--ray", "127.0.0.1:1") == 2  # (nothing listens on loopback's port 1)
    err = capsys.readouterr().err
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in err and len(err.strip().splitlines()) == 1, err


def test_status_shows_no_seat_that_no_node_took_as_a_host_down():
    from taiji.launch.sched.cli import format_status

    reply = {
        "jobs": [],
        "slots": 1,
        "policy": "drf",
        "now": 0.0,
        "host_names": ["10.0.0.1", "10.0.0.2", ""],
        "up": [True, False, False],
    }
    assert (
        format_status(reply).splitlines()[-1] == "0/1 slots in use on 1 host(s) (10.0.0.2 down); policy drf"
    )
