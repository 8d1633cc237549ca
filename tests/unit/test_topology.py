"""Allreduce plans (comm/topology.py): the pure layout and tree, then every plan on threads
against a real TCPStore with ranks on two loopback "hosts" (127.0.0.1 and 127.0.0.2): the same
sum as a reference, the same bytes on every rank, async handles, a switch between plans, and a
lost peer surfacing as a CommError."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from taiji.cluster.store import connect_store, host_store
from taiji.comm.communicator import CommOptions, Communicator
from taiji.comm.topologies import TOPOLOGIES
from taiji.comm.topology import host_layout, tree_links
from taiji.errors import CommError, ConfigError

pytestmark = pytest.mark.timeout(120)

A, B, C = "127.0.0.1", "127.0.0.2", "127.0.0.3"


def test_host_layout_groups_ranks_by_host_in_order_of_their_lowest_rank():
    layout = host_layout([A, A, B, B, A, C])
    assert layout.groups == ((0, 1, 4), (2, 3), (5,)) and layout.leaders == (0, 2, 5)
    assert [layout.host_index(r) for r in range(6)] == [0, 0, 1, 1, 0, 2]


def test_tree_links_form_one_binary_tree():
    size = 6
    links = {r: tree_links(r, size) for r in range(size)}
    assert links[0] == (None, (1, 2)) and links[2] == (0, (5,)) and links[5] == (2, ())
    for rank, (parent, _) in links.items():  # each child is its parent's child exactly once
        if parent is not None:
            assert rank in links[parent][1]


def _on_ranks(hosts: list[str], topology: str, body, timeout: float = 10.0) -> list:
    """``body(comm)`` on one thread per rank; rank r advertises ``hosts[r]``."""
    server = host_store()
    results: list = [None] * len(hosts)
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        comm = Communicator(
            connect_store("127.0.0.1", server.port),
            rank,
            len(hosts),
            1,
            CommOptions(timeout=timeout, host=hosts[rank], hosts=tuple(hosts), topology=topology),
        )
        try:
            results[rank] = body(comm)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            comm.close()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return results


def _inputs(rank: int, numel: int = 1000) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(rank))


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize(
    "hosts", [[A, A, B, B], [A, B, A, B, C], [A, A, A]], ids=["2x2", "interleaved", "one-host"]
)
def test_every_plan_sums_exactly_and_every_rank_ends_with_the_same_bytes(topology, hosts, monkeypatch):
    from taiji.comm import topology as plans

    calls: list[int] = []
    plan = plans.PLANS[topology]
    monkeypatch.setitem(
        plans.PLANS, topology, lambda tensor, groups: (calls.append(groups.rank), plan(tensor, groups))
    )
    monkeypatch.setattr(plans, "CHUNK_ELEMENTS", 96)  # star and tree: 11 pieces, the last one short
    reference = torch.stack([_inputs(r).double() for r in range(len(hosts))]).sum(0)

    def body(comm: Communicator) -> list[torch.Tensor]:
        mine = _inputs(comm.rank)
        summed = comm.allreduce(mine.clone(), "sum")
        handles = [comm.allreduce(mine.clone() * k, "avg", async_op=True) for k in (1, 2)]  # overlapped
        return [summed] + [h.wait() for h in handles]

    results = _on_ranks(hosts, topology, body)
    for rank_results in results:
        for got, expected in zip(
            rank_results, (reference, reference / len(hosts), 2 * reference / len(hosts))
        ):
            assert torch.allclose(got.double(), expected, atol=1e-5), topology
    for i in range(3):  # bitwise identical replicas
        assert all(torch.equal(r[i], results[0][i]) for r in results), f"{topology}: ranks differ"
    # the plan ran (3 allreduces on every rank), unless it is gloo's ring as it stands
    assert len(calls) == (0 if plans.runs_as_ring(topology, hosts) else 3 * len(hosts)), (topology, calls)


def test_plans_switch_at_the_same_point_and_other_channels_stay_on_the_ring():
    def body(comm: Communicator) -> list[float]:
        got = []
        for name in ("hierarchical", "tree", "ring", "star"):
            comm.set_topology(name)
            got.append(float(comm.allreduce(torch.ones(3), "sum")[0]))
        got.append(float(comm.allreduce(torch.ones(1), "max", channel="ctrl")[0]))
        return got

    assert _on_ranks([A, A, B], "ring", body) == [[3.0, 3.0, 3.0, 3.0, 1.0]] * 3
    with pytest.raises(ConfigError, match="unknown topology 'mesh'"):
        Communicator(host_store(), 0, 1, 1, CommOptions(topology="mesh"))


def test_a_rank_missing_from_a_hierarchical_allreduce_is_a_comm_error_not_a_hang():
    def body(comm: Communicator):
        comm.allreduce(torch.ones(10), "sum")  # every group of the plan is up
        if comm.rank == 3:
            return None  # leaves: its host's reduce fails, then the leaders', then the broadcasts
        with pytest.raises(CommError):
            comm.allreduce(torch.ones(10), "sum")
        return "failed cleanly"

    # the leaver closes its groups, so the others fail at once; the timeout only bounds the first
    # allreduce on a loaded machine
    assert _on_ranks([A, A, B, B], "hierarchical", body, timeout=6.0)[:3] == ["failed cleanly"] * 3


def test_hierarchical_needs_every_ranks_host():
    def body(comm: Communicator):
        with pytest.raises(ConfigError, match="needs each rank's host"):
            comm.layout()
        return True

    server = host_store()
    comm = Communicator(
        connect_store("127.0.0.1", server.port), 0, 2, 1, CommOptions(topology="hierarchical")
    )
    assert body(comm)
    comm.close()


@pytest.mark.parametrize("topology", ["tree", "hierarchical"])
def test_a_job_trains_and_grows_under_a_chosen_topology_with_identical_replicas(topology, tmp_path):
    """`taiji run --topology`: every worker, the joiner too, allreduces gradients with the plan;
    exactly-once data and bitwise-identical replicas hold through a grow (docs/design.md#invariants)."""
    from taiji_harness.testing import check_invariants, run_elastic

    done = run_elastic(
        tmp_path,
        2,
        "--steps",
        "120",
        "--sizes",
        "3",
        "--every",
        "10",
        "--step-delay",
        "0.1",
        launcher_args=["--topology", topology, "--max-np", "3"],
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert check_invariants(tmp_path, 16)["sizes"] == [2, 3]


def test_the_launchers_topology_reaches_every_worker(monkeypatch):
    from taiji.launch.worker_env import WorkerSettings, worker_env
    from taiji.runtime.peer import PeerOptions

    settings = WorkerSettings("j", "127.0.0.1", 1, ("python",), topology="star")
    environ = worker_env(settings, b"s" * 32, "w0", 0, 1, host="127.0.0.1", local_rank=0, local_size=1)
    assert environ["TAIJI_TOPOLOGY"] == "star"
    monkeypatch.setenv("TAIJI_TOPOLOGY", "star")
    assert PeerOptions.from_env().topology == "star"
    from taiji.launch.arguments import parse_run
    from taiji.launch.parser import build_parser

    with pytest.raises(ConfigError, match="unknown topology 'mesh'"):
        parse_run(
            build_parser().parse_args(["run", "-np", "1", "--topology", "mesh", "python", "-c", "pass"])
        )


def test_which_plans_are_gloos_ring_as_they_stand():
    from taiji.comm.topology import runs_as_ring

    assert (
        runs_as_ring("ring", [A, B])
        and runs_as_ring("hierarchical", [A, A, A])
        and runs_as_ring("hierarchical", [A, B])
    )
    assert not runs_as_ring("hierarchical", [A, A, B]) and not runs_as_ring("tree", [A, A])


def test_set_topology_switches_every_worker_at_a_step_boundary_and_a_joiner_adopts_it(tmp_path):
    """A policy cycles tree -> hierarchical -> star -> ring every 5 steps while the job grows 2 -> 3
    (the joiner syncs the plan in use): exactly-once data, bitwise-identical replicas, and the
    trajectory of a 1-worker run with the same policy (docs/design.md#invariants)."""
    from taiji_harness.testing import check_invariants, run_elastic

    done = run_elastic(
        tmp_path,
        2,
        # a cap: the schedule ends the job 12 steps after the joiner lands (a loaded host boots it late)
        "--steps",
        "400",
        "--sizes",
        "3",
        "--every",
        "12",
        "--step-delay",
        "0.1",
        "--policy",
        "topology",
        launcher_args=["--max-np", "3"],
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert check_invariants(tmp_path, 16, "topology")["sizes"] == [2, 3]
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert all(f"SetTopology(name='{name}')" in events for name in ("tree", "hierarchical", "star", "ring"))
    # the run log says, per step, which plan the gradients went through and what the step waited for it
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {s["topology"] for s in steps} >= {"tree", "hierarchical", "star", "ring"}, steps[:3]
    assert all(s["allreduce_wait_ms"] >= 0 for s in steps)


def test_set_topology_is_validated_like_every_decision():
    from taiji.policies import Context, SetTopology
    from taiji.policies.runner import validate

    ctx = Context(
        step=0,
        epoch=0,
        cursor=0,
        num_samples=10,
        size=2,
        version=1,
        batch_size=4,
        lr=0.1,
        strategy="sync_sgd",
        time=0.0,
        topology="ring",
    )
    assert validate(ctx, SetTopology("tree")) == (SetTopology("tree"), None)
    assert validate(ctx, SetTopology("ring")) == (None, None)  # already so: nothing to do
    decision, note = validate(ctx, SetTopology("mesh"))
    assert decision is None and "rejected SetTopology('mesh')" in note


def test_adaptive_topology_tries_each_plan_keeps_the_fastest_and_retries_when_the_cluster_changes():
    from taiji.policies import AdaptiveTopology, Context, Metrics
    from taiji.policies.runner import run_hooks

    cost = {"ring": 0.30, "hierarchical": 0.20, "tree": 0.80}
    policy = AdaptiveTopology(("ring", "hierarchical", "tree"), trial_steps=3, settle=1)
    topology, size, chosen = "ring", 4, []
    for step in range(60):
        if step == 30:
            size, cost = (
                6,
                {"ring": 0.25, "hierarchical": 0.40, "tree": 0.90},
            )  # a host joined: now the ring wins
        ctx = Context(
            step=step,
            epoch=0,
            cursor=0,
            num_samples=1000,
            size=size,
            version=1,
            batch_size=8,
            lr=0.1,
            strategy="sync_sgd",
            time=0.0,
            topology=topology,
            metrics=Metrics(step_seconds=cost[topology]),
        )
        _, plan = run_hooks([policy], ["after_step"], ctx)
        if plan.topology is not None:
            topology = plan.topology
            chosen.append((step, topology))
    assert chosen[:3] == [(4, "hierarchical"), (8, "tree"), (12, "hierarchical")], chosen
    assert policy.medians == {"ring": 0.25, "hierarchical": 0.40, "tree": 0.90} and topology == "ring"
    assert chosen[3][0] == 30 and chosen[3][1] == "ring"  # the retry starts at the change
    with pytest.raises(ConfigError):
        AdaptiveTopology(("mesh",))


def test_adaptive_topology_compares_the_allreduce_waits_when_the_workers_report_them():
    """The wait arrives a step late (it rides the next control message): the plan in use two steps
    back is what a figure measures. Step times that say otherwise (compute noise) are ignored."""
    from taiji.policies import AdaptiveTopology, Context, Metrics
    from taiji.policies.runner import run_hooks

    wait = {"ring": 0.10, "hierarchical": 0.05, "tree": 0.30}
    policy = AdaptiveTopology(("ring", "hierarchical", "tree"), trial_steps=3, settle=1)
    history, chosen = ["ring"], []
    for step in range(20):
        previous = history[-2] if len(history) > 1 else history[-1]  # the plan of the step reported late
        ctx = Context(
            step=step,
            epoch=0,
            cursor=0,
            num_samples=1000,
            size=4,
            version=1,
            batch_size=8,
            lr=0.1,
            strategy="sync_sgd",
            time=0.0,
            topology=history[-1],
            metrics=Metrics(
                step_seconds=1.0 if history[-1] == "hierarchical" else 0.5,
                allreduce_seconds=None if step == 0 else wait[previous],
            ),
        )
        _, plan = run_hooks([policy], ["after_step"], ctx)
        history.append(plan.topology or history[-1])
        if plan.topology is not None:
            chosen.append((step, plan.topology))
    assert policy.measure == "allreduce" and policy.medians == wait, policy.medians
    assert chosen == [(5, "hierarchical"), (10, "tree"), (15, "hierarchical")], chosen


def test_job_topology_argument_reaches_every_workers_communicator():
    """`Job(topology=...)`: the plan every worker's gradients use from the first step (threads,
    one loopback host: hierarchical would be the ring itself, so tree)."""
    import taiji
    from taiji_harness.testing import run_threads

    def body(peer):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
        job = taiji.Job(model, opt, data, 8, peer=peer, log_every=0, topology="tree", max_steps=3)
        for step in job:
            x, y = step.batch
            step.backward(torch.nn.functional.cross_entropy(model(x), y))
        return peer.comm.topology, [p.detach().clone() for p in model.parameters()]

    (t0, p0), (t1, p1) = run_threads(2, body)
    assert t0 == t1 == "tree" and all(torch.equal(a, b) for a, b in zip(p0, p1))
    with pytest.raises(ConfigError, match="unknown topology"):
        taiji.Job(
            torch.nn.Linear(1, 1),
            torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1),
            torch.utils.data.TensorDataset(torch.randn(4, 1)),
            2,
            topology="mesh",
        )


def test_adaptive_topology_starts_its_trials_over_when_the_allreduce_waits_arrive_late():
    """Trials begun on step times (no wait reported yet) are not left waiting for a kind of
    figure that never comes: the first wait restarts them on waits."""
    from taiji.policies import AdaptiveTopology, Context, Metrics
    from taiji.policies.runner import run_hooks

    policy = AdaptiveTopology(("ring", "tree"), trial_steps=2, settle=0)
    topology, decisions = "ring", []
    for step in range(30):
        wait = None if step < 3 else {"ring": 0.2, "tree": 0.1}[topology]
        ctx = Context(
            step=step,
            epoch=0,
            cursor=0,
            num_samples=1000,
            size=2,
            version=1,
            batch_size=8,
            lr=0.1,
            strategy="sync_sgd",
            time=0.0,
            topology=topology,
            metrics=Metrics(step_seconds=0.5, allreduce_seconds=wait),
        )
        _, plan = run_hooks([policy], ["after_step"], ctx)
        if plan.topology is not None:
            topology = plan.topology
            decisions.append((step, topology))
    assert policy.measure == "allreduce" and policy.chosen == "tree" and topology == "tree", (
        policy.medians,
        decisions,
    )
