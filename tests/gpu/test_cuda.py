"""The CUDA path, on a machine with a GPU (every test here skips without one; CI has none).

The same invariant checks as tests/faults (tests/scripts/elastic_train.py with ``--device cuda``):
replicas bitwise identical after every committed step, every sample once per epoch, and the
trajectory of an uninterrupted 1-worker CPU run. Several workers share the one GPU through gloo
(`taiji run --cuda-backend gloo`): NCCL refuses two ranks on one device. Figures of the Job loop
against a plain PyTorch loop on the GPU: benchmarks/gpu.py.
"""
import json

import pytest
import torch

from taiji_harness.testing import check_invariants, load_script, run_elastic

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
              pytest.mark.timeout(300)]

GLOO = ["--cuda-backend", "gloo"]


def test_one_worker_job_on_cuda_follows_the_cpu_trajectory():
    from taiji.runtime.peer import Peer
    script = load_script("elastic_train")
    on_gpu, job = script.train(Peer.solo(), 40, 16, device="cuda")
    on_cpu, _ = script.train(Peer.solo(), 40, 16)
    assert job.progress.step == 40 and job.stats is not None and job.stats.loss == job.stats.loss  # not NaN
    assert max(float((a - b).abs().max()) for a, b in zip(on_gpu, on_cpu)) < 1e-9


def test_workers_sharing_one_gpu_through_gloo_grow_and_shrink_keeping_every_invariant(tmp_path):
    proc = run_elastic(tmp_path, 2, "--device", "cuda", "--steps", "3000", "--step-delay", "0.005",
                       "--sizes", "3", "4", "2", launcher_args=["--max-np", "4", *GLOO], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    result = check_invariants(tmp_path, 16)
    assert result["sizes"] == [2, 3, 4, 2]
    from taiji.metrics.runlog import read_jsonl
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")  # the monitors ran on CUDA gradients
    gns = [m["gns"] for m in metrics if m["gns"] is not None]
    assert gns and all(g == g for g in gns) and {m["size"] for m in metrics} == {2, 3, 4}  # not NaN


@pytest.mark.parametrize("phase", ["allreduce", "compute"])
def test_a_worker_killed_mid_step_on_cuda_costs_the_step_only(tmp_path, phase):
    faults = [{"action": "kill", "rank": 1, "step": 12, "phase": phase}]
    proc = run_elastic(tmp_path, 3, "--device", "cuda", "--steps", "40", faults=faults, launcher_args=GLOO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert check_invariants(tmp_path, 16)["sizes"] == [3, 2]
    recovery = [t for t in json.loads((tmp_path / "w0.transitions.json").read_text()) if t["reason"] == "failure"]
    assert len(recovery) == 1 and recovery[0]["step"] == 12


def test_topology_plans_switched_while_training_on_cuda(tmp_path):
    proc = run_elastic(tmp_path, 3, "--device", "cuda", "--steps", "40", "--policy", "topology",
                       launcher_args=GLOO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    check_invariants(tmp_path, 16, "topology")


@pytest.mark.parametrize("strategy", ["model_averaging", "pair_averaging", "local_sgd"])
def test_decoupled_strategies_on_cuda_grow_and_shrink_with_exactly_once_data(tmp_path, strategy):
    proc = run_elastic(tmp_path, 3, "--device", "cuda", "--steps", "3000", "--step-delay", "0.005",
                       "--sizes", "4", "2", "--strategy", strategy, launcher_args=["--max-np", "4", *GLOO])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    result = load_script("elastic_train").audit_positions(tmp_path)
    assert result["positions"] > 200 and result["lost"] == 0 and result["duplicated"] == 0, result



def test_batches_bound_for_the_gpu_are_pinned_and_arrive_intact():
    from torch.utils.data import TensorDataset

    from taiji.data.fetch import BatchFetcher, pinned
    data = TensorDataset(torch.arange(64.0).reshape(32, 2), torch.arange(32))
    fetch = BatchFetcher(data, device="cuda")
    indices = torch.tensor([3, 1, 4, 1, 5])
    fetch.fetch_ahead("k", indices)
    for key in ("k", None):  # loaded ahead, and loaded when asked for
        x, y = fetch(indices, key)
        assert x.is_cuda and torch.equal(x.cpu(), data.tensors[0][indices]) and torch.equal(y.cpu(), indices)
    assert all(t.is_pinned() for t in pinned({"a": [torch.ones(2)], "b": (torch.zeros(1),)})["a"])
