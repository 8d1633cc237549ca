"""The CUDA path, on a machine with a GPU (every test here skips without one; CI has none).

The same invariant checks as tests/faults (tests/scripts/elastic_train.py with ``--device cuda``):
replicas bitwise identical after every committed step, every sample once per epoch, and the
trajectory of an uninterrupted 1-worker CPU run. Several workers share the one GPU through gloo
(`taiji run --cuda-backend gloo`): NCCL refuses two ranks on one device. Figures of the Job loop
against a plain PyTorch loop on the GPU: `benchmarks/throughput.py --device cuda`. Checkpoints of
CUDA state: staged from GPU memory while the next step runs, resumed bitwise (dropout's CUDA
random stream included) and at another size.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import taiji
from taiji.checkpoint.storage import Storage
from taiji.runtime.peer import Peer
from taiji_harness.testing import check_invariants, load_script, merge_runs, run_elastic

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
    pytest.mark.timeout(300),
]

GLOO = ["--cuda-backend", "gloo"]


def test_one_worker_job_on_cuda_follows_the_cpu_trajectory():
    script = load_script("elastic_train")
    on_gpu, job = script.train(Peer.solo(), 40, 16, device="cuda")
    on_cpu, _ = script.train(Peer.solo(), 40, 16)
    assert job.progress.step == 40 and job.stats is not None and job.stats.loss == job.stats.loss  # not NaN
    assert max(float((a - b).abs().max()) for a, b in zip(on_gpu, on_cpu)) < 1e-9


def test_workers_sharing_one_gpu_through_gloo_grow_and_shrink_keeping_every_invariant(tmp_path):
    proc = run_elastic(
        tmp_path,
        2,
        "--device",
        "cuda",
        "--steps",
        "3000",
        "--step-delay",
        "0.005",
        "--sizes",
        "3",
        "4",
        "2",
        launcher_args=["--max-np", "4", *GLOO],
        timeout=240,
    )
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
    recovery = [
        t for t in json.loads((tmp_path / "w0.transitions.json").read_text()) if t["reason"] == "failure"
    ]
    assert len(recovery) == 1 and recovery[0]["step"] == 12


def test_topology_plans_switched_while_training_on_cuda(tmp_path):
    proc = run_elastic(
        tmp_path, 3, "--device", "cuda", "--steps", "40", "--policy", "topology", launcher_args=GLOO
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    check_invariants(tmp_path, 16, "topology")


@pytest.mark.parametrize("strategy", ["model_averaging", "pair_averaging", "local_sgd"])
def test_decoupled_strategies_on_cuda_grow_and_shrink_with_exactly_once_data(tmp_path, strategy):
    proc = run_elastic(
        tmp_path,
        3,
        "--device",
        "cuda",
        "--steps",
        "3000",
        "--step-delay",
        "0.005",
        "--sizes",
        "4",
        "2",
        "--strategy",
        strategy,
        launcher_args=["--max-np", "4", *GLOO],
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    result = load_script("elastic_train").audit_positions(tmp_path)
    assert result["positions"] > 200 and result["lost"] == 0 and result["duplicated"] == 0, result


def test_batches_bound_for_the_gpu_are_pinned_and_arrive_intact():
    from taiji.data.fetch import BatchFetcher, pinned

    data = TensorDataset(torch.arange(64.0).reshape(32, 2), torch.arange(32))
    fetch = BatchFetcher(data, device="cuda")
    indices = torch.tensor([3, 1, 4, 1, 5])
    fetch.fetch_ahead("k", indices)
    for key in ("k", None):  # loaded ahead, and loaded when asked for
        x, y = fetch(indices, key)
        assert x.is_cuda and torch.equal(x.cpu(), data.tensors[0][indices]) and torch.equal(y.cpu(), indices)
    assert all(t.is_pinned() for t in pinned({"a": [torch.ones(2)], "b": (torch.zeros(1),)})["a"])


# -- checkpoints of CUDA state -------------------------------------------------------------


def _train_with_dropout(checkpoint, max_steps):
    torch.manual_seed(3)  # the model's init; dropout then draws from the CUDA generator
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(64, 2)
    ).cuda()
    torch.cuda.manual_seed(5)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(48, 4, generator=g), torch.randint(0, 2, (48,), generator=g))
    job = taiji.Job(
        model,
        opt,
        data,
        8,
        peer=Peer.solo(),
        log_every=0,
        epochs=3,
        max_steps=max_steps,
        data=taiji.DataOptions(seed=1, device="cuda"),
        checkpoint=checkpoint,
    )
    for step in job:
        x, y = step.batch
        step.backward(F.cross_entropy(model(x), y))
    return model


def test_a_cuda_job_resumed_from_its_checkpoint_ends_bitwise_equal_dropout_included(tmp_path):
    """The state is staged from GPU memory while the next step runs, and loaded back onto the GPU;
    the CUDA generator's stream (dropout's) continues from the checkpoint."""
    reference = _train_with_dropout(None, 14)
    root = str(tmp_path / "ck")
    _train_with_dropout(taiji.Checkpoint(root, steps=4, keep=5), 10)
    assert Storage(root).listing().complete == (4, 8, 10)
    resumed = _train_with_dropout(taiji.Checkpoint(root, steps=4, resume=f"{root}/step-00000008"), 14)
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), resumed.parameters()))
    on_cpu = torch.nn.Sequential(
        torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(64, 2)
    )
    assert taiji.load_checkpoint(root, on_cpu)["step"] == 14  # and a plain CPU script loads it
    assert all(torch.equal(a.cpu(), b) for a, b in zip(resumed.parameters(), on_cpu.parameters()))


def _records(out) -> dict[int, str]:
    return {
        json.loads(ln)["step"]: json.loads(ln)["digest"] for ln in (out / "w0.jsonl").read_text().splitlines()
    }


def test_workers_on_one_gpu_resume_from_checkpoints_bitwise_and_at_another_size(tmp_path):
    """2 workers checkpoint every 4 steps; resumed from step 28 with 2 workers they retrain each
    step bitwise as before; resumed from step 32 with 3, the merged runs keep every invariant."""
    ck = tmp_path / "ck"

    def run(name, nproc, *extra):
        out = tmp_path / name
        out.mkdir()
        proc = run_elastic(
            out,
            nproc,
            "--device",
            "cuda",
            "--steps",
            "36",
            launcher_args=[*GLOO, "--max-np", "3", "--checkpoint-every", "4", *extra],
            timeout=150,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
        return out

    a = run("a", 2, "--checkpoint-dir", str(ck))
    assert Storage(str(ck)).listing().complete == (28, 32, 36)
    b = run("b", 2, "--checkpoint-dir", str(tmp_path / "ck_b"), "--resume", str(ck / "step-00000028"))
    first, redone = _records(a), _records(b)
    assert min(redone) == 28 and all(redone[s] == first[s] for s in range(28, 36)), "a redone step differs"
    c = run("c", 3, "--checkpoint-dir", str(tmp_path / "ck_c"), "--resume", str(ck / "step-00000032"))
    merge_runs([(a, 0, 32), (c, 32, 36)], tmp_path / "merged")
    result = check_invariants(tmp_path / "merged", 16)
    assert result["steps"] == 36 and result["sizes"] == [2, 3], result
